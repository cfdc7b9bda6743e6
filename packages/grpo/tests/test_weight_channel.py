"""The weight channel between processes (`engines.weight_channel`): a signed socket nobody else can feed.

Both ends run on threads of this process over 127.0.0.1 (the channel is the same between processes;
tests/test_async.py's Ray runs use it so). A foreign client, one with another secret, an impostor
sender and a tampered message are each refused with nothing loaded, and the run's own transfer is
still exact. Last, the training world's store (`engines.rendezvous.join_world`) listens on its
host only, as the channel does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from entrepot.dock.signing import new_secret, sign
from entrepot.grpo.engines import weight_channel
from entrepot.grpo.engines.weight_channel import WeightChannel
from entrepot.grpo.engines.weight_sync import PublishedWeights, publish
from entrepot.grpo.errors import WeightSyncError

SECRET = new_secret()


def _weights(version: int) -> PublishedWeights:
    g = torch.Generator().manual_seed(version)
    return publish(version, {
        "embed": torch.randn(5, 3, generator=g, dtype=torch.float32),
        "norm": torch.randn(7, generator=g).to(torch.bfloat16),
        "count": torch.arange(4, dtype=torch.int64) + version,
    })  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as error:  # handed to the test
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _sender(address: str, secret: bytes = SECRET, timeout: float = 30.0) -> WeightChannel:
    return WeightChannel(address, secret, sender=True, timeout=timeout, source="actor rank 0",
                         target="rollout rank 0")  # fmt: skip


def _receiver(address: str, secret: bytes = SECRET, timeout: float = 30.0) -> WeightChannel:
    return WeightChannel(address, secret, sender=False, timeout=timeout, source="actor rank 0",
                         target="rollout rank 0")  # fmt: skip


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]  # (tcp6: where IPv6 is on)
    rows = [line.split() for t in tables if t.exists() for line in t.read_text().splitlines()[1:]]
    return [r[1] for r in rows if r[3] == "0A" and int(r[1].rsplit(":", 1)[1], 16) == port]


def _wait_listening(port: int) -> None:
    for _ in range(2000):
        if _listening(port):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"nothing listens on {port}")


def _closed(conn: socket.socket) -> bool:
    """Whether the peer closed `conn` without a byte (a reset counts: it closed with ours unread)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def _assert_same(got: PublishedWeights, sent: PublishedWeights) -> None:
    mine, theirs = got.verified("actor rank 0", "rollout rank 0"), sent.verified("a", "b")
    assert mine.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name


def test_weights_cross_exactly_and_the_port_listens_on_the_given_address_only_until_the_receiver_is_in() -> (
    None
):
    port = _port()
    address = f"127.0.0.1:{port}"
    thread, out = _in_thread(lambda: _sender(address))
    _wait_listening(port)
    assert _listening(port) == [f"0100007F:{port:04X}"]  # 127.0.0.1 only, not *:port
    receiver = _receiver(address)
    thread.join(30)
    sender = out["value"]
    assert _listening(port) == []  # the listening socket closed once the receiver proved the secret
    for version in (1, 2):
        sent = _weights(version)
        t, _ = _in_thread(lambda sent=sent: sender.send(sent))  # type: ignore[misc]
        got = receiver.receive(version)
        t.join(30)
        assert got.version == version
        _assert_same(got, sent)
    sender.close()
    receiver.close()


def test_a_foreign_client_is_refused_with_nothing_loaded_and_the_runs_own_transfer_is_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(weight_channel, "_HANDSHAKE_S", 2.0)  # how long the idle client (3.) holds it
    port = _port()
    address = f"127.0.0.1:{port}"
    thread, out = _in_thread(lambda: _sender(address))
    _wait_listening(port)
    forged = _weights(1)  # what the foreign client would have the rollout load
    # 1. a client that knows nothing writes a message as the channel frames one, without the secret
    with socket.create_connection(("127.0.0.1", port)) as foreign:
        hello = weight_channel._read(foreign, len(weight_channel._MAGIC) + weight_channel._NONCE)
        assert hello.startswith(weight_channel._MAGIC)
        foreign.sendall(b"\0" * 16 + b"f" * 64 + b'{"version": 1}' * 8)
        assert _closed(foreign)  # unanswered
    # 2. one that follows the protocol, signing with another secret
    with socket.create_connection(("127.0.0.1", port)) as foreign:
        nonce = weight_channel._read(foreign, len(weight_channel._MAGIC) + 16)[-16:]
        theirs = b"\1" * 16
        foreign.sendall(theirs + sign(new_secret(), "receiver", (nonce + theirs).hex()).encode())
        assert _closed(foreign)
    # 3. one that connects and says nothing does not keep the run's receiver out for longer than a handshake
    idle = socket.create_connection(("127.0.0.1", port))
    receiver = _receiver(address)
    thread.join(30)
    idle.close()
    sender: WeightChannel = out["value"]
    assert sender.refused == 3
    sent = _weights(7)
    assert not torch.equal(sent.buckets[0], forged.buckets[0])
    t, _ = _in_thread(lambda: sender.send(sent))
    got = receiver.receive(7)
    t.join(30)
    _assert_same(got, sent)  # the run's own weights, exactly


def test_an_impostor_sender_is_refused_by_the_receiver_before_anything_is_read() -> None:
    """Something else holds the port and speaks the protocol, signing with another secret."""
    with socket.socket() as impostor:
        impostor.bind(("127.0.0.1", 0))
        impostor.listen(1)

        def serve() -> bytes:
            conn, _ = impostor.accept()
            with conn:
                nonce = b"\2" * 16
                conn.sendall(weight_channel._MAGIC + nonce)
                theirs = weight_channel._read(conn, 16 + 64)[:16]
                conn.sendall(sign(new_secret(), "sender", (nonce + theirs).hex()).encode())
                conn.sendall(b"{}" * 100)  # and whatever it would have the receiver load
                return conn.recv(1)

        thread, out = _in_thread(serve)
        with pytest.raises(WeightSyncError, match="the peer did not prove the run's secret"):
            _receiver(f"127.0.0.1:{impostor.getsockname()[1]}", timeout=10.0)
        thread.join(30)
    assert out["value"] == b""  # the receiver hung up without a word more


def test_a_tampered_message_is_refused_with_nothing_returned() -> None:
    """A byte of a bucket changed on the way (after the sender signed it): the receiver raises."""
    port = _port()
    address = f"127.0.0.1:{port}"
    thread, out = _in_thread(lambda: _sender(address))
    _wait_listening(port)
    receiver = _receiver(address)
    thread.join(30)
    sender: WeightChannel = out["value"]
    wire_in, wire_out = socket.socketpair()
    real, sender._conn = sender._conn, wire_in  # the sender writes into a wire the test reads
    sender.send(_weights(3))
    wire_in.close()
    data = bytearray()
    while chunk := wire_out.recv(1 << 16):
        data += chunk
    data[-64 - 5] ^= 0xFF  # inside the last bucket, before the buckets' signature
    real.sendall(bytes(data))
    with pytest.raises(WeightSyncError, match="buckets' signature does not match"):
        receiver.receive(3)
    real.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "[::]"])
def test_a_wildcard_address_is_refused_before_anything_listens(host: str) -> None:
    with pytest.raises(WeightSyncError, match="a wildcard would listen on every interface"):
        _sender(f"{host}:{_port()}")


def test_the_training_worlds_store_listens_on_its_host_only() -> None:
    """torch's own tcp:// rendezvous listens on *:port; `join_world` binds rank 0's store to the host
    (a one-rank world in this process, gone at the end)."""
    import torch.distributed as dist

    from entrepot.grpo.engines.rendezvous import free_local_port, join_world

    port = free_local_port()
    join_world("gloo", f"tcp://127.0.0.1:{port}", 0, 1)
    try:
        assert _listening(port) == [f"0100007F:{port:04X}"]
        ones = torch.ones(3)
        dist.all_reduce(ones)
        assert ones.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
    assert _listening(port) == []
