"""A free TCP port for torch.distributed's rendezvous, chosen where nothing else takes it.

The driver (or a task on rank 0's node of a cluster) picks the port and rank 0 listens on it seconds
later, once its worker has started. A
port from `bind(0)` lies in the kernel's ephemeral range, which every outgoing connection draws its
local port from: with Ray's many connections one took the port in that window (EADDRINUSE in CI).
Ports between Ray's worker ports (10002-19999 by default) and the ephemeral range are taken only by
another listener, so the port is drawn from there.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_local_port"]

_ABOVE_RAY_WORKER_PORTS = 20000
_DEFAULT_EPHEMERAL_START = 32768


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_START


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_local_port(tries: int = 200, host: str = "127.0.0.1") -> int:
    """A port of this machine's `host` address free now and outside the ephemeral range (else `bind(0)`).

    `host` is 127.0.0.1 for ranks on one machine, the node's cluster address for ranks across nodes.
    """
    end = _ephemeral_start()
    if end - _ABOVE_RAY_WORKER_PORTS >= tries:
        for port in random.SystemRandom().sample(range(_ABOVE_RAY_WORKER_PORTS, end), tries):
            if _is_free(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
