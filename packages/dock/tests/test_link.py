"""The link (_link) on its own: a channel's calls over a Unix socket, and the table that serves them."""

from __future__ import annotations

import os
import threading

import pytest

from entrepot.dock import InvalidArgumentError, UnknownColumnError, _link
from entrepot.dock._channel import DIRECTORY, MIN_CAPACITY, create, names_made_by, unlink
from entrepot.dock._channel_table import ChannelTable


def _pair(handler, on_close=lambda: None):
    """(client connection, server) joined through a socket made by `listen`, as the client and actor do."""
    server_socket, name = _link.listen()
    connection = _link.connect(name)
    client = _link.accept(server_socket, name)
    return client, _link.Server(connection, handler, on_close)


def _leftovers() -> list[str]:
    """The names this process made that are still there (not another run's on this machine)."""
    return names_made_by(os.getpid())


def test_calls_return_results_and_raise_the_handlers_errors_as_themselves():
    before = _leftovers()
    calls = []

    def handler(message):
        calls.append(message)
        if message == "bad column":
            raise UnknownColumnError("nope", ["x"])
        if message == "unpicklable":
            raise ValueError(lambda: None)  # a lambda does not pickle: its text comes back
        return ("echo", message)

    client, _ = _pair(handler)
    assert _leftovers() == before  # the name is gone once the actor connected
    assert _link.call(client, {"rows": [1, 2]}) == ("echo", {"rows": [1, 2]})
    with pytest.raises(UnknownColumnError, match="'nope'"):
        _link.call(client, "bad column")
    with pytest.raises(RuntimeError, match="ValueError"):
        _link.call(client, "unpicklable")
    assert _link.call(client, "still served") == ("echo", "still served")
    assert len(calls) == 4
    client.close()


def test_closing_between_calls_runs_no_later_call_and_the_client_sees_it_closed():
    runs, closed = [], threading.Event()
    client, server = _pair(lambda message: runs.append(message) or len(runs), closed.set)
    assert _link.call(client, "first") == 1
    server.close()
    assert closed.wait(10)
    with pytest.raises(_link.LinkClosed):
        _link.call(client, "second")
    assert runs == ["first"]  # the call after the close was not run


def test_a_close_during_a_call_lets_that_call_answer_first():
    entered, go_on, closed = threading.Event(), threading.Event(), threading.Event()

    def slow(message):
        entered.set()
        go_on.wait(10)
        return message

    client, server = _pair(slow, closed.set)
    answer = []
    caller = threading.Thread(target=lambda: answer.append(_link.call(client, "slow")))
    caller.start()
    assert entered.wait(10)
    server.close()  # does not cut the running call
    go_on.set()
    caller.join(10)
    assert answer == ["slow"] and closed.wait(10)
    with pytest.raises(_link.LinkClosed):
        _link.call(client, "next")


def test_the_server_ends_when_the_client_goes():
    closed = threading.Event()
    client, _ = _pair(lambda message: message, closed.set)
    client.close()
    assert closed.wait(10)


def test_connect_refuses_what_listen_did_not_make(tmp_path):
    with pytest.raises(InvalidArgumentError, match="not a dock link name"):
        _link.connect("../etc/passwd")
    with pytest.raises(InvalidArgumentError, match="cannot be found"):
        _link.connect(f"entrepot-dock-link-{os.getpid()}-" + "0" * 32)
    channel = create(MIN_CAPACITY)  # a regular file under a link's kind of name
    fake = channel.name.replace("-channel-", "-link-")
    os.link(os.path.join(DIRECTORY, channel.name), os.path.join(DIRECTORY, fake))
    try:
        with pytest.raises(InvalidArgumentError, match="not a socket of this user"):
            _link.connect(fake)
    finally:
        os.unlink(os.path.join(DIRECTORY, fake))
        unlink(channel)


def test_the_table_serves_a_channels_link_and_forgets_the_channel_when_its_client_goes():
    channel = create(MIN_CAPACITY)
    server_socket, link = _link.listen()
    try:
        table = ChannelTable()
        seen = []
        table.attach(channel.name, channel.capacity, link, lambda name, message: seen.append((name, message)))
        client = _link.accept(server_socket, link)
    finally:
        unlink(channel)
    _link.call(client, "put")
    assert seen == [(channel.name, "put")] and table.room(channel.name, 8) is not None
    client.close()
    for _ in range(1000):
        if table.room(channel.name, 8) is None:
            break
        threading.Event().wait(0.01)
    assert len(table) == 0  # the channel went with its client's link


def test_the_table_closes_the_link_of_a_channel_it_drops_past_its_limit():
    made = [create(MIN_CAPACITY) for _ in range(2)]
    clients = []
    try:
        table = ChannelTable(limit=1)
        for each in made:
            server_socket, link = _link.listen()
            table.attach(each.name, each.capacity, link, lambda name, message: name)
            clients.append(_link.accept(server_socket, link))
    finally:
        for each in made:
            unlink(each)
    assert _link.call(clients[1], "x") == made[1].name
    with pytest.raises(_link.LinkClosed):
        _link.call(clients[0], "x")  # dropped past the limit: its client falls back to Ray


def test_an_interrupted_call_closes_the_socket_so_no_later_call_reads_its_reply(monkeypatch):
    """Ctrl-C while a reply is awaited: the reply would be read by the next call as its own. The
    socket is closed instead, and the actor's side sees it close."""
    closed = threading.Event()
    client, _ = _pair(lambda message: message, closed.set)
    real = _link.receive

    def interrupted(connection):
        raise KeyboardInterrupt

    monkeypatch.setattr(_link, "receive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _link.call(client, "first")
    monkeypatch.setattr(_link, "receive", real)
    assert client.fileno() == -1 and closed.wait(10)
    with pytest.raises(_link.LinkClosed):
        _link.call(client, "second")
