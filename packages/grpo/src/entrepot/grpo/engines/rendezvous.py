"""torch.distributed's rendezvous: a free TCP port, chosen where nothing else takes it; a store bound to it.

The driver (or a task on rank 0's node of a cluster) picks the port and rank 0 listens on it seconds
later, once its worker has started. A
port from `bind(0)` lies in the kernel's ephemeral range, which every outgoing connection draws its
local port from: with Ray's many connections one took the port in that window (EADDRINUSE in CI).
Ports between Ray's worker ports (10002-19999 by default) and the ephemeral range are taken only by
another listener, so the port is drawn from there.

`join_world` joins the process group at ``tcp://host:port`` with rank 0's store listening on `host`
only: torch's own ``tcp://`` rendezvous makes a TCPStore that listens on every interface whatever host
it is given, so rank 0 binds the socket itself and hands it to the store.
"""

from __future__ import annotations

import datetime
import random
import socket
from pathlib import Path

__all__ = ["free_local_port", "join_world"]

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


def join_world(backend: str, init_method: str, rank: int, world_size: int) -> None:
    """`torch.distributed.init_process_group` at `init_method`, rank 0's store bound to its host.

    A ``tcp://host:port`` address: rank 0 listens on (host, port) itself (127.0.0.1 when every rank is
    on one node, else rank 0's node address: `Placement.rendezvous`), never on every interface. Any
    other method (``env://``, ``file://``) is torch's own.
    """
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    if not init_method.startswith("tcp://"):
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
        return
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    timeout: datetime.timedelta = default_pg_timeout
    listen_fd = None
    if rank == 0:
        server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.bind((host, int(port)))
            server.listen(4096)
        except BaseException:
            server.close()
            raise
        listen_fd = server.detach()  # the store owns (and closes) it from here
    store = dist.TCPStore(host, int(port), world_size, rank == 0, timeout=timeout, master_listen_fd=listen_fd)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
