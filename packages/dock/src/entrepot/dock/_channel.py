"""A same-node shared-memory channel that carries a Ray dock's puts and gets past Ray's object store.

Ray's object store costs more than a copy per object: the writer creates and seals an object for
every call, and depending on the process's state it faults in every page of it again
(`bench_dock.py` prints one `ray.put` of a get's bytes against a copy, and the Ray calls with and
without this channel). When a `RayDockClient` runs on its actor's node, the client instead creates
one file in shared memory (/dev/shm) and both processes map it once: the client writes a put's rows
into it and the actor a get's, and Ray carries only the call and the small layout. The client
unlinks the file as soon as the actor has mapped it, so no file outlives the two processes,
whichever dies first.

Every name this package puts in the shared-memory folder says whose it is:
``entrepot-dock-<kind>-<pid>-<32 hex>``, the pid of the process that made it (`new_name`). A
process only ever removes names it made, and `names_made_by` lists one process's, so a check for
leftovers (or a cleaner) never counts or touches another run's on the same machine.

One call uses a channel at a time: the client holds a lock from writing a put (or sending a get)
until the actor has stored the rows (or its batch is copied out), so neither side ever reads bytes
the other is still writing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import stat
import tempfile
from dataclasses import dataclass

import torch

from entrepot.dock._errors import InvalidArgumentError

DIRECTORY = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_OWNED = "entrepot-dock-"
_NAME = re.compile(re.escape(_OWNED) + "channel-[0-9]+-[0-9a-f]{32}")
MIN_CAPACITY = 1 << 20
"""Puts and replies smaller than this stay on Ray: its fixed cost per object matters less there."""
MAX_REGIONS = 3
"""Reply regions per client: a get's batch is laid out in one and handed out as views of it, so a
region is busy while its batch lives; a consumer holding more batches than this gets copies."""


@dataclass(frozen=True)
class Channel:
    """One shared-memory buffer: `name` (the file's, in the shared-memory folder) and its bytes."""

    name: str
    buffer: torch.Tensor  # uint8 [capacity], a MAP_SHARED mapping of the file
    mapping: mmap.mmap  # that mapping (a batch laid out in a reply region views it through numpy)

    @property
    def capacity(self) -> int:
        return int(self.buffer.numel())


def new_name(kind: str) -> str:
    """A fresh name of `kind` ("channel" or "link") that names this process:
    ``entrepot-dock-<kind>-<pid>-<32 hex>``."""
    return f"{_OWNED}{kind}-{os.getpid()}-{secrets.token_hex(16)}"


def names_made_by(pid: int) -> list[str]:
    """The channel and link names process `pid` made that are still in the shared-memory folder."""
    mine = re.compile(re.escape(_OWNED) + f"(channel|link)-{pid}-[0-9a-f]{{32}}")
    return sorted(name for name in os.listdir(DIRECTORY) if mine.fullmatch(name))


def capacity_for(nbytes: int) -> int:
    """The capacity a channel gets for calls of `nbytes`: room to grow by half, in whole MiB."""
    return max(MIN_CAPACITY, -(-(nbytes * 3 // 2) // MIN_CAPACITY) * MIN_CAPACITY)


def create(capacity: int) -> Channel:
    """A new channel file of `capacity` bytes, mapped here (the client's side).

    The space is reserved at once (`posix_fallocate`), so a full /dev/shm fails here with OSError
    instead of a SIGBUS at the first write into a page it could not back. OSError too off POSIX: the
    client then keeps every call on Ray.
    """
    if os.name != "posix":
        raise OSError("no shared-memory channel on this platform (POSIX only)")  # Ray carries the calls
    name = new_name("channel")
    path = os.path.join(DIRECTORY, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, capacity)
        else:  # pragma: no cover - macOS
            os.ftruncate(fd, capacity)
        return Channel(name, *_map(fd, capacity))
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def unlink(channel: Channel) -> None:
    """Remove the channel's file name; the mappings stay valid until both sides drop them."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(DIRECTORY, channel.name))


def attach(name: str, capacity: int) -> Channel:
    """Map a client's channel file (the actor's side), refusing anything but a file `create` made.

    Raises:
        InvalidArgumentError: `name` is not a channel name, or its file is missing, not a regular
            file of this user, or not `capacity` bytes long.
    """
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"{name!r} is not a dock channel name")
    try:
        fd = os.open(os.path.join(DIRECTORY, name), os.O_RDWR | os.O_NOFOLLOW)
    except OSError as error:
        raise InvalidArgumentError(f"dock channel {name!r} cannot be opened: {error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size != capacity:
            raise InvalidArgumentError(f"dock channel {name!r} is not a {capacity}-byte file of this user")
        return Channel(name, *_map(fd, capacity))
    finally:
        os.close(fd)


def _map(fd: int, capacity: int) -> tuple[torch.Tensor, mmap.mmap]:
    """uint8 [capacity] over a shared mapping of `fd` (the tensor keeps the mapping alive), and it."""
    mapping = mmap.mmap(fd, capacity, mmap.MAP_SHARED)
    return torch.frombuffer(mapping, dtype=torch.uint8), mapping
