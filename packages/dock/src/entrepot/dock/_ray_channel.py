"""A Ray dock client's end of its same-node shared-memory channel: when to make, grow and drop one.

The channel itself (the /dev/shm file both processes map) is _channel's, the socket its calls go
over is _link's; this is the client's policy around them. One call uses the channel at a time
(`claim`, `call`, then `release`). After a put or a get reply of 1 MiB or more went through Ray,
`fit` makes a channel, or a larger one, if this process runs on the actor's node; after a get whose
batch found no free reply region, `fit_region` makes one (see `Region`). When the client is gone
its socket closes and the actor unmaps the channel and its regions.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import Any

import numpy as np
import ray
import torch

from entrepot.dock import _channel, _link


class Region:
    """A reply region: shared memory the actor lays a get's batch out in, handed out as views of it.
    Busy from the get until the batch's last tensor is gone (see `view`)."""

    def __init__(self, channel: _channel.Channel) -> None:
        self.channel = channel
        self.busy = False

    def view(self, nbytes: int) -> torch.Tensor:
        """uint8 [nbytes] at the region's start whose memory, once unreferenced, frees the region:
        a numpy array over the mapping (torch tensors made from it keep it alive)."""
        base = np.frombuffer(self.channel.mapping, dtype=np.uint8, count=nbytes)
        weakref.finalize(base, self._free)
        return torch.from_numpy(base)

    def _free(self) -> None:
        self.busy = False


class ClientChannel:
    """The channel of one RayDockClient to its actor (none until a large call went through Ray).

    Args:
        actor: the DockActor (or DockShard) handle: it has `attach_channel` and `node_id`.
        enabled: False keeps every call on Ray; it turns False by itself when no channel can be made
            (the actor runs on another node, or shared memory has no room).
        node: the actor's Ray node id when the caller knows it (else the actor is asked).
    """

    def __init__(self, actor: Any, enabled: bool, node: str | None = None) -> None:
        self.actor = actor
        self.enabled = enabled
        self._node = node
        self._current: _channel.Channel | None = None
        self._connection: socket.socket | None = None
        self._lock = threading.Lock()  # held by the one call using the channel
        self._forget: weakref.finalize | None = None
        self._floor = 0  # the capacity of the last channel dropped: the next is never smaller
        self._pid = os.getpid()
        self._regions: list[Region] = []  # reply regions, see `region`

    @property
    def capacity(self) -> int:
        """Bytes of the channel (0: none yet, or calls travel through Ray)."""
        current = self._current
        return 0 if current is None else current.capacity

    def claim(self) -> _channel.Channel | None:
        """The channel, locked for one call; None when there is none, another call holds it, or this
        is a forked child of the process that made it (the socket is the parent's)."""
        if self._current is None or self._pid != os.getpid() or not self._lock.acquire(blocking=False):
            return None
        if self._current is None:  # dropped between the check and the lock
            self._lock.release()
            return None
        return self._current

    def release(self) -> None:
        """End the call that `claim` handed the channel to."""
        self._lock.release()

    def call(self, message: Any) -> Any:
        """Send a put or get over the claimed channel's link; its reply, or the actor's error raised.

        Raises:
            _link.LinkClosed: the link closed before the reply (the actor died, or it dropped the
                channel between calls, when this call was not run).
        """
        self.send(message)
        return self.receive()

    def send(self, message: Any) -> None:
        """`call` in two halves: send now, `receive` later (calls to several actors at once)."""
        assert self._connection is not None  # a claimed channel has its link
        _link.send_checked(self._connection, message)

    def receive(self) -> Any:
        """The reply to the message `send` sent: its value, or the actor's error raised here."""
        assert self._connection is not None
        return _link.reply(self._connection)

    def drop(self) -> None:
        """Forget the claimed channel (its link closed): the next large call makes another. Its
        regions go with it (the actor forgets them; batches that view one keep it mapped here)."""
        if self._forget is not None:
            self._forget()
        self._floor = max(self._floor, self.capacity)
        self._current = self._connection = self._forget = None
        self._regions = []

    def region(self) -> Region | None:
        """A free reply region (the largest), now busy, for the claimed channel's next get; None if
        every region is busy (or there is none yet)."""
        free = [region for region in self._regions if not region.busy]
        if not free:
            return None
        region = max(free, key=lambda each: each.channel.capacity)
        region.busy = True
        return region

    def fit_region(self, nbytes: int) -> None:
        """After a get whose batch (`nbytes` laid out) found no free region large enough: make one,
        or replace the smallest free one, up to `_channel.MAX_REGIONS` (small batches: none)."""
        if nbytes < _channel.MIN_CAPACITY or not self._lock.acquire(blocking=False):
            return
        try:
            current = self._current
            if current is None or any(r.channel.capacity >= nbytes for r in self._regions if not r.busy):
                return
            free = [region for region in self._regions if not region.busy]
            if len(self._regions) >= _channel.MAX_REGIONS and not free:
                return
            try:
                region = _channel.create(_channel.capacity_for(nbytes))
            except OSError:
                return  # no shared memory to spare: gets copy out of the channel
            try:
                if len(self._regions) >= _channel.MAX_REGIONS:
                    smallest = min(free, key=lambda each: each.channel.capacity)
                    self._regions.remove(smallest)
                    ray.get(self.actor.detach_channel.remote(smallest.channel.name))
                ray.get(self.actor.attach_region.remote(current.name, region.name, region.capacity))
            except ray.exceptions.RayError:
                return
            finally:
                _channel.unlink(region)
            self._regions.append(Region(region))
        finally:
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
            floor = max(self._floor, 0 if current is None else current.capacity)
            self._replace(max(_channel.capacity_for(nbytes), floor))
        finally:
            self._lock.release()

    def _replace(self, capacity: int) -> None:
        """Drop the channel (the actor unmaps it) and open one of `capacity` bytes with its link, if
        this process runs on the actor's node and shared memory has room; otherwise calls stay on Ray."""
        self.drop()  # closing the old link tells the actor to unmap the old channel
        try:
            here = str(ray.get_runtime_context().get_node_id())
            node = self._node or ray.get(self.actor.node_id.remote())
            if node != here:
                self.enabled = False
                return
            channel = _channel.create(capacity)
        except (OSError, ray.exceptions.RayError):
            self.enabled = False  # no shared memory to spare here, or the actor is gone
            return
        try:
            server, link = _link.listen()
        except OSError:
            _channel.unlink(channel)
            self.enabled = False
            return
        try:
            # The actor maps the channel and connects inside this call (the connection waits in
            # the socket's backlog), so `accept` returns at once after it.
            ray.get(self.actor.attach_channel.remote(channel.name, channel.capacity, link))
            connection = _link.accept(server, link)
        except (OSError, ray.exceptions.RayError):
            self.enabled = False  # e.g. the actor sees another /dev/shm (a container)
            _link.close_listener(server, link)
            return
        finally:
            _channel.unlink(channel)  # both sides have it mapped (or the actor never will)
        self._current, self._connection, self._pid = channel, connection, os.getpid()
        self._forget = weakref.finalize(self, connection.close)  # the actor then unmaps the channel
        self._forget.atexit = False  # at exit the process's sockets close anyway


class ActorLink:
    """A same-node link (see _link) to an actor that serves one without shared memory (a sharded
    dock's controller, whose calls carry statuses, not rows): made at the first call when this
    process runs on the actor's node; one call uses it at a time, the others go through Ray.

    Args:
        actor: the handle; it has `attach_link(name)`.
        node: the actor's Ray node id.
    """

    def __init__(self, actor: Any, node: str) -> None:
        self.actor = actor
        self._node = node
        self.enabled = True
        self._connection: socket.socket | None = None
        self._lock = threading.Lock()
        self._forget: weakref.finalize | None = None
        self._pid = os.getpid()

    def claim(self) -> bool:
        """True: the link is this call's until `release` (made now if need be); False: use Ray."""
        if not self.enabled or self._pid != os.getpid() or not self._lock.acquire(blocking=False):
            return False  # (a forked child does not share its parent's socket: Ray)
        if self._connection is None:
            self._connect()
        if self._connection is None:
            self._lock.release()
            return False
        return True

    def release(self) -> None:
        self._lock.release()

    def call(self, message: Any) -> Any:
        """The claimed link's call; `_link.LinkClosed` if it closed (then the link is dropped)."""
        assert self._connection is not None
        try:
            return _link.call(self._connection, message)
        except _link.LinkClosed:
            if self._forget is not None:
                self._forget()
            self._connection = self._forget = None
            raise

    def _connect(self) -> None:
        try:
            if self._node != str(ray.get_runtime_context().get_node_id()):
                self.enabled = False
                return
            server, name = _link.listen()
        except OSError:
            self.enabled = False
            return
        try:
            ray.get(self.actor.attach_link.remote(name))  # the actor connects inside this call
            connection = _link.accept(server, name)
        except (OSError, ray.exceptions.RayError):
            self.enabled = False
            _link.close_listener(server, name)
            return
        self._connection = connection
        self._forget = weakref.finalize(self, connection.close)  # the actor's thread then ends
        self._forget.atexit = False
