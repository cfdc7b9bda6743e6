"""Published weights from the trainer's rank 0 to a rollout rank in another process: one signed socket.

The sender listens on the address it is given, the node's own (127.0.0.1 when both ends share a node;
a wildcard address is refused), only until the receiver has connected: then the listening socket
closes. A connection counts once each end has proved the run's secret (`entrepot.dock.signing`; the
driver makes the secret and gives it to both ends through Ray): the sender sends a random nonce, the
receiver answers with its own and the signature of both, the sender answers with its signature. Any
other client is closed unanswered (counted in `refused`) and the sender waits on.

Each version is one message: a JSON header (its buckets' dtypes and sizes, the tensors' places, the
checksums) and its signature, then the buckets' raw bytes, then the signature of their SHA-256
digests. Both signatures cover the session's nonces and the message's sequence number, so a message
is valid once, on this connection. The receiver checks the header's signature before it allocates
anything and the buckets' before it returns them. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import struct
import time
from typing import Any

import torch

from entrepot.dock.signing import sign, signed
from entrepot.grpo.engines.weight_sync import PublishedWeights
from entrepot.grpo.errors import WeightSyncError

__all__ = ["WILDCARD_HOSTS", "WeightChannel"]

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*", "[::]"})
"""Addresses that would listen on every interface: refused."""

_MAGIC = b"entrepot-weights/1\n"
_NONCE = 16
_TAG = 64  # hex digits of an HMAC-SHA256
_LENGTH = struct.Struct("!Q")
_MAX_HEADER = 64 << 20
_HANDSHAKE_S = 10.0  # the longest one client may hold the listening socket before it answers
_CHUNK = 16 << 20
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}  # fmt: skip


class _Refused(Exception):
    """A peer that did not prove the run's secret, or broke the protocol."""


class WeightChannel:
    """A signed socket from the trainer's rank 0 (sender) to a rollout rank (receiver); see the module
    docstring. Every wait is bounded by `timeout`; a peer that does not come or a transfer that fails is
    a `WeightSyncError` naming both ranks.

    Args:
        address: ``host:port`` the sender listens on (its node's own address, or 127.0.0.1).
        secret: the run's secret (`entrepot.dock.signing.new_secret`), the same at both ends.
        sender: this end sends (True) or receives.
        timeout: seconds any wait may take.
        source, target: the two ranks' names, for errors.

    Attributes:
        refused: connections the sender closed because they did not prove the secret.
    """

    def __init__(
        self, address: str, secret: bytes, *, sender: bool, timeout: float, source: str, target: str
    ) -> None:
        self.source, self.target, self.sender, self.timeout = source, target, sender, timeout
        self.refused = 0
        host, _, port = address.rpartition(":")
        if host in WILDCARD_HOSTS or not port.isdigit():
            reason = f"address {address!r}: give a host's own address and a port (a wildcard would listen on "
            raise WeightSyncError(source, target, -1, reason + "every interface)")
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise WeightSyncError(source, target, -1, "the channel secret must be at least 16 bytes")
        self._secret, self._seq = secret, 0
        try:
            self._conn, self._session = (
                self._accept(host, int(port)) if sender else self._connect(host, int(port))
            )
        except (OSError, _Refused) as error:
            raise WeightSyncError(source, target, -1, f"could not connect at {address}: {error}") from None

    # -- the two messages' ends -------------------------------------------------------------------

    def send(self, weights: PublishedWeights) -> float:
        """Send `weights` (the receiver calls `receive` with the same version); seconds it took."""
        t0 = time.perf_counter()
        header = json.dumps({
            "version": weights.version,
            "buckets": [[str(b.dtype), b.numel()] for b in weights.buckets],
            "places": [[n, b, o, list(s)] for n, (b, o, s) in weights.places.items()],
            "sums": [int(s) for s in weights.sums.tolist()],
        })  # fmt: skip
        seq, self._seq = self._seq, self._seq + 1
        try:
            data = header.encode()
            tag = sign(self._secret, "header", self._session, seq, header)
            self._conn.sendall(_LENGTH.pack(len(data)) + data + tag.encode())
            digests = []
            for bucket in weights.buckets:
                raw = _bytes_of(bucket.detach().cpu().contiguous())
                digests.append(hashlib.sha256(raw).hexdigest())
                self._conn.sendall(raw)
            self._conn.sendall(sign(self._secret, "buckets", self._session, seq, digests).encode())
        except OSError as error:
            raise WeightSyncError(
                self.source, self.target, weights.version, f"send failed: {error}"
            ) from None
        return time.perf_counter() - t0

    def receive(self, version: int) -> PublishedWeights:
        """Version `version`'s weights, in fresh buckets (their checksums are checked when loaded)."""
        t0 = time.perf_counter()
        seq, self._seq = self._seq, self._seq + 1
        try:
            (size,) = _LENGTH.unpack(_read(self._conn, _LENGTH.size))
            if size > _MAX_HEADER:
                raise _Refused(f"a header of {size} bytes (at most {_MAX_HEADER})")
            header = _read(self._conn, size).decode()
            if not signed(
                self._secret, _read(self._conn, _TAG).decode(), "header", self._session, seq, header
            ):
                raise _Refused("the header's signature does not match the run's secret")
            shapes, places, sums = _parse(json.loads(header), version)
            buckets = tuple(torch.empty(n, dtype=d) for d, n in shapes)
            digests = []
            for bucket in buckets:
                raw = _bytes_of(bucket)
                _read_into(self._conn, raw)
                digests.append(hashlib.sha256(raw).hexdigest())
            if not signed(
                self._secret, _read(self._conn, _TAG).decode(), "buckets", self._session, seq, digests
            ):
                raise _Refused("the buckets' signature does not match the run's secret")
        except (OSError, ValueError, KeyError, TypeError, _Refused) as error:  # (decode and JSON: ValueError)
            raise WeightSyncError(self.source, self.target, version, f"receive failed: {error}") from None
        return PublishedWeights(version, buckets, sums, places, time.perf_counter() - t0)

    def close(self) -> None:
        self._conn.close()

    # -- making the connection ------------------------------------------------------------------

    def _accept(self, host: str, port: int) -> tuple[socket.socket, str]:
        """Listen on (host, port) until a client proves the secret (or the timeout); then stop listening."""
        deadline = time.monotonic() + self.timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as server:
            server.bind((host.strip("[]"), port))
            server.listen(4)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no client proved the run's secret within {self.timeout:g} s "
                                       f"({self.refused} refused)")  # fmt: skip
                server.settimeout(left)
                conn, _ = server.accept()
                try:
                    conn.settimeout(min(left, _HANDSHAKE_S))
                    session = self._handshake_sender(conn)
                except (OSError, ValueError, _Refused):
                    conn.close()
                    self.refused += 1
                    continue
                conn.settimeout(self.timeout)
                return conn, session

    def _handshake_sender(self, conn: socket.socket) -> str:
        ours = secrets.token_bytes(_NONCE)
        conn.sendall(_MAGIC + ours)
        theirs = _read(conn, _NONCE)
        session = (ours + theirs).hex()
        if not signed(self._secret, _read(conn, _TAG).decode("ascii"), "receiver", session):
            raise _Refused("the client did not prove the run's secret")
        conn.sendall(sign(self._secret, "sender", session).encode())
        return session

    def _connect(self, host: str, port: int) -> tuple[socket.socket, str]:
        """Connect to the sender (retrying while it is not listening yet) and prove the secret both ways."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                conn = socket.create_connection((host.strip("[]"), port), timeout=max(left, 0.1))
                break
            except ConnectionRefusedError:
                if left <= 0:
                    raise
                time.sleep(0.05)
        try:
            conn.settimeout(self.timeout)
            if _read(conn, len(_MAGIC)) != _MAGIC:
                raise _Refused("the peer is not a weight channel")
            theirs, ours = _read(conn, _NONCE), secrets.token_bytes(_NONCE)
            session = (theirs + ours).hex()
            conn.sendall(ours + sign(self._secret, "receiver", session).encode())
            if not signed(self._secret, _read(conn, _TAG).decode("ascii"), "sender", session):
                raise _Refused("the peer did not prove the run's secret")
        except BaseException:
            conn.close()
            raise
        return conn, session


def _parse(header: Any, version: int) -> tuple[list[tuple[torch.dtype, int]], dict[str, Any], torch.Tensor]:
    """A signed header's buckets (dtype, elements), places and checksums, for `version`."""
    if not isinstance(header, dict) or header.get("version") != version:
        held = header.get("version") if isinstance(header, dict) else header
        raise _Refused(f"the message holds version {held!r}, not {version}")
    shapes = [(_DTYPES[dtype], int(n)) for dtype, n in header["buckets"]]
    places = {str(n): (int(b), int(o), torch.Size(int(d) for d in s)) for n, b, o, s in header["places"]}
    return shapes, places, torch.tensor(header["sums"], dtype=torch.int64)


def _bytes_of(bucket: torch.Tensor) -> memoryview:
    """A contiguous 1-D tensor's bytes (shared with it)."""
    return bucket.view(torch.uint8).numpy().data


def _read(conn: socket.socket, size: int) -> bytes:
    out = bytearray(size)
    _read_into(conn, memoryview(out))
    return bytes(out)


def _read_into(conn: socket.socket, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = conn.recv_into(into[got:], min(len(into) - got, _CHUNK))
        if n == 0:
            raise ConnectionError(f"the peer closed the connection ({got} of {len(into)} bytes read)")
        got += n
