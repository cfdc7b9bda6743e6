"""A Ray dock client's end of its same-node shared-memory channel: when to make, grow and drop one.

The channel itself (the /dev/shm file both processes map) is _channel's; this is the client's
policy around it. One call uses the channel at a time (`claim`, then `release`). After a put or a
get reply of 1 MiB or more went through Ray, `fit` makes a channel, or a larger one, if this
process runs on the actor's node; when the client is gone the actor is told to unmap it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

import ray

from entrepot.dock import _channel


class ClientChannel:
    """The channel of one RayDockClient to its actor (none until a large call went through Ray).

    Args:
        actor: the DockActor handle.
        enabled: False keeps every call on Ray; it turns False by itself when no channel can be made
            (the actor runs on another node, or shared memory has no room).
    """

    def __init__(self, actor: Any, enabled: bool) -> None:
        self.actor = actor
        self.enabled = enabled
        self._current: _channel.Channel | None = None
        self._lock = threading.Lock()  # held by the one call using the channel
        self._forget: weakref.finalize | None = None

    @property
    def capacity(self) -> int:
        """Bytes of the channel (0: none yet, or calls travel through Ray)."""
        current = self._current
        return 0 if current is None else current.capacity

    def claim(self) -> _channel.Channel | None:
        """The channel, locked for one call; None when there is none or another call holds it."""
        if self._current is None or not self._lock.acquire(blocking=False):
            return None
        if self._current is None:  # dropped between the check and the lock
            self._lock.release()
            return None
        return self._current

    def release(self) -> None:
        """End the call that `claim` handed the channel to."""
        self._lock.release()

    def fit(self, nbytes: int, offered: _channel.Channel | None) -> None:
        """After a put or a get reply of `nbytes` went through Ray: make (or grow) the channel.

        One that went through Ray although a channel was offered did not fit it, or the actor no
        longer knows it (restarted, or it dropped it past its limit): both call for a new one.
        """
        if not self.enabled or nbytes < _channel.MIN_CAPACITY:
            return
        if not self._lock.acquire(blocking=False):
            return  # another call is using the channel: the next one will tell again
        try:
            current = self._current
            if current is not None and current is not offered and current.capacity >= nbytes:
                return  # this call found the channel busy (or it was replaced since): it still fits
            # Never smaller than the channel it replaces (the actor may just have forgotten that one).
            floor = 0 if current is None else current.capacity
            self._replace(max(_channel.capacity_for(nbytes), floor))
        finally:
            self._lock.release()

    def _replace(self, capacity: int) -> None:
        """Drop the channel (the actor unmaps it) and open one of `capacity` bytes, if this process
        runs on the actor's node and shared memory has room; otherwise replies stay on Ray."""
        if self._forget is not None:
            self._forget()  # tells the actor to unmap the old one
        self._current = self._forget = None
        try:
            here = str(ray.get_runtime_context().get_node_id())
            if ray.get(self.actor.node_id.remote()) != here:
                self.enabled = False
                return
            channel = _channel.create(capacity)
        except (OSError, ray.exceptions.RayError):
            self.enabled = False  # no shared memory to spare here, or the actor is gone
            return
        try:
            ray.get(self.actor.attach_channel.remote(channel.name, channel.capacity))
        except ray.exceptions.RayError:
            self.enabled = False  # e.g. the actor sees another /dev/shm (a container)
            return
        finally:
            _channel.unlink(channel)  # both sides have it mapped (or the actor never will)
        self._current = channel
        self._forget = weakref.finalize(self, _detach_quietly, self.actor, channel.name)
        self._forget.atexit = False  # at exit the actor goes too, or keeps it until its limit


def _detach_quietly(actor: Any, name: str) -> None:
    """Ask the actor to unmap channel `name` (fire and forget: the actor or Ray may be gone)."""
    if not ray.is_initialized():
        return  # Ray was shut down (a call now would start a new local Ray)
    with contextlib.suppress(Exception):  # the actor may be gone
        actor.detach_channel.remote(name)
