"""A same-node call path beside a shared-memory channel: one Unix socket per channel.

With a call's rows in the channel (see _channel), what is left to send is a small message: the
layout, the row indexes, a lease. A Ray actor call costs 0.5-2 ms on this kind of host (a task
submitted, scheduled, its reply stored as an object) and more under load; a round trip over a Unix
socket costs tens of microseconds. So a client that has a channel sends its puts and gets over
the channel's socket, and Ray carries only everything else.

The client makes the socket as it makes the channel file (in the shared-memory folder, mode 0600,
so only this user's processes can connect) and unlinks it once the actor has connected. The actor
serves it on a thread of its own, one call at a time (the client sends one at a time); a call's
exception goes back as the reply. When the client goes, the actor's thread sees the socket close,
forgets the channel and ends.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import socket
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from entrepot.dock._channel import DIRECTORY, new_name
from entrepot.dock._errors import InvalidArgumentError

_NAME = re.compile(r"entrepot-dock-link-[0-9]+-[0-9a-f]{32}")  # `_channel.new_name`'s, of a link
_HEADER = struct.Struct("!Q")  # the length of the pickled message that follows
CONNECT_TIMEOUT_S = 30.0
"""How long the client waits for its actor to connect (the actor connects inside its attach call)."""

Handler = Callable[[Any], Any]


class LinkClosed(ConnectionError):
    """The socket closed before this call's reply came: the actor is gone, or it dropped the channel
    between two calls (then the call was not run: the actor closes a link only between calls)."""


def listen() -> tuple[socket.socket, str]:
    """A listening socket of this user's only (mode 0600), and the name the actor connects to."""
    name = new_name("link")
    path = os.path.join(DIRECTORY, name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        os.chmod(path, 0o600)  # before listen(): nobody could connect in between
        server.listen(1)
    except BaseException:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return server, name


def accept(server: socket.socket, name: str) -> socket.socket:
    """The actor's connection on `server` (then the listening socket and its name are gone)."""
    try:
        server.settimeout(CONNECT_TIMEOUT_S)
        connection, _ = server.accept()
    finally:
        close_listener(server, name)
    connection.settimeout(None)
    return connection


def close_listener(server: socket.socket, name: str) -> None:
    """Close a listening socket whose actor will not connect, and remove its name."""
    server.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(DIRECTORY, name))


def connect(name: str) -> socket.socket:
    """Connect to a client's socket `name` (the actor's side), refusing anything `listen` did not make.

    Raises:
        InvalidArgumentError: `name` is not a link name, or its file is not a socket of this user.
    """
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"{name!r} is not a dock link name")
    path = os.path.join(DIRECTORY, name)
    try:
        info = os.lstat(path)
    except OSError as error:
        raise InvalidArgumentError(f"dock link {name!r} cannot be found: {error}") from None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise InvalidArgumentError(f"dock link {name!r} is not a socket of this user")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError as error:
        connection.close()
        raise InvalidArgumentError(f"dock link {name!r} refused the connection: {error}") from None
    return connection


def send(connection: socket.socket, message: Any) -> None:
    """One message: its length, then its pickle (one write for both)."""
    connection.sendall(_frame(message))


def _frame(message: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_HEADER.pack(0))  # the length, filled in below
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    data = buffer.getbuffer()
    data[: _HEADER.size] = _HEADER.pack(len(data) - _HEADER.size)
    return bytes(data)


class _Pickler(pickle.Pickler):
    """Pickles a CPU tensor as its numpy array: torch's own reduction writes a storage through
    torch.save, which costs more than the bytes of a put's small index tensors."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            try:
                return torch.from_numpy, (obj.numpy(),)
            except TypeError:  # a dtype numpy lacks (bfloat16): torch's own reduction
                pass
        return NotImplemented


def receive(connection: socket.socket) -> Any:
    """The next message; `LinkClosed` if the other side closed first."""
    (size,) = _HEADER.unpack(_exactly(connection, _HEADER.size))
    return pickle.loads(_exactly(connection, size))


def _exactly(connection: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        read = connection.recv_into(view[got:])
        if read == 0:
            raise LinkClosed("the dock link closed")
        got += read
    return bytes(data)


def call(connection: socket.socket, message: Any) -> Any:
    """Send `message`, wait for the reply: its value, or its exception raised here.

    Raises:
        LinkClosed: the socket closed (or failed) before the reply came.
    """
    send_checked(connection, message)
    return reply(connection)


def send_checked(connection: socket.socket, message: Any) -> None:
    """`send` for a call: `LinkClosed` if the socket failed; closed if anything else interrupts it."""
    with _closed_on_interrupt(connection):
        try:
            send(connection, message)
        except OSError as error:
            raise LinkClosed(f"the dock link failed: {error!r}") from None


def reply(connection: socket.socket) -> Any:
    """The reply to the message sent last: its value, or its exception raised here.

    Raises:
        LinkClosed: the socket closed (or failed) before the reply came.
    """
    with _closed_on_interrupt(connection):
        try:
            ok, value = receive(connection)
        except OSError as error:  # LinkClosed, a reset
            raise LinkClosed(f"the dock link failed: {error!r}") from None
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def _closed_on_interrupt(connection: socket.socket) -> Iterator[None]:
    """Close the socket if anything but its own failure interrupts a send or receive (Ctrl-C): half
    a message, or a reply left unread, would put every later call out of step. The next call then
    finds it closed; the actor, seeing it close, forgets the channel."""
    try:
        yield
    except LinkClosed:
        raise
    except BaseException:
        connection.close()
        raise


class Server:
    """The actor's end of one link: a thread that runs `handler` on each message and sends back
    (True, result) or (False, exception); `on_close` runs once the client has gone."""

    def __init__(self, connection: socket.socket, handler: Handler, on_close: Callable[[], None]) -> None:
        self._connection = connection
        self._handler = handler
        self._on_close = on_close
        self._busy = threading.Lock()  # held while a call runs: `close` never cuts one
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="dock-link", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while True:
                try:
                    message = receive(self._connection)
                except OSError:  # the client closed its end, or `close` shut this one
                    return
                with self._busy:
                    if self._closing:  # `close` came between the message and this lock: not run
                        return
                    try:
                        reply: tuple[bool, Any] = (True, self._handler(message))
                    except BaseException as error:  # the caller's error, raised in the client
                        reply = (False, error)
                    try:
                        frame = _frame(reply)
                    except Exception:  # a result or exception that does not pickle: its text
                        frame = _frame((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
                    try:
                        self._connection.sendall(frame)
                    except OSError:
                        return
                if self._closing:
                    return
        finally:
            self._connection.close()
            self._on_close()

    def close(self) -> None:
        """End the link between two calls: now if none runs, else once its reply is sent (the client's
        next call finds the link closed, and was not run)."""
        self._closing = True
        if self._busy.acquire(blocking=False):
            try:
                with contextlib.suppress(OSError):
                    self._connection.shutdown(socket.SHUT_RDWR)
            finally:
                self._busy.release()
