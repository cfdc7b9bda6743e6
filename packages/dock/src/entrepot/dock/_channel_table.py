"""The actor's side of same-node channels: the channels a dock actor (or shard) has mapped, and
the link each one's calls come over (see _channel and _link)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from entrepot.dock import _channel, _link
from entrepot.dock._errors import InvalidArgumentError


class ChannelTable:
    """The channels an actor has mapped, by name, each with the link its calls come over (see _link)
    and its client's reply regions (see `attach_region`).

    A channel goes, with its regions, when its client closes the link, or (least recently used
    first) past `limit` channels: its link is closed between two calls, and the client makes another.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._channels: OrderedDict[str, tuple[_channel.Channel, _link.Server | None]] = OrderedDict()
        self._regions: dict[str, dict[str, _channel.Channel]] = {}  # channel -> its client's reply regions
        self._lock = threading.Lock()

    def attach(
        self,
        name: str,
        capacity: int,
        link: str | None = None,
        handler: Callable[[str, Any], Any] | None = None,
    ) -> None:
        """Map channel `name`; with `link`, connect to the client's socket and serve its calls on
        a thread, each as `handler(name, message)` (see _link)."""
        channel, server = _channel.attach(name, capacity), None
        if link is not None and handler is not None:
            connection = _link.connect(link)
            server = _link.Server(
                connection, lambda message: handler(name, message), lambda: self.detach(name)
            )
        with self._lock:
            self._channels[name] = (channel, server)
            self._channels.move_to_end(name)
            evicted = []
            while len(self._channels) > self.limit:
                old_name, (_, old_server) = self._channels.popitem(last=False)
                self._regions.pop(old_name, None)
                evicted.append(old_server)
        for old in evicted:
            if old is not None:
                old.close()  # its client falls back to Ray and makes another

    def attach_region(self, owner: str, name: str, capacity: int) -> None:
        """Map a reply region of the client whose channel is `owner` (see `_channel.MAX_REGIONS`).

        Raises:
            InvalidArgumentError: `owner` is not a mapped channel, it has `MAX_REGIONS` regions, or
                `name` is not a channel file (see `_channel.attach`).
        """
        region = _channel.attach(name, capacity)
        with self._lock:
            if owner not in self._channels:
                raise InvalidArgumentError(f"dock channel {owner!r} is not mapped here: no region for it")
            owned = self._regions.setdefault(owner, {})
            if name not in owned and len(owned) >= _channel.MAX_REGIONS:
                raise InvalidArgumentError(f"dock channel {owner!r} has {len(owned)} reply regions already")
            owned[name] = region

    def region_room(self, owner: str | None, name: str | None, nbytes: int) -> torch.Tensor | None:
        """The first `nbytes` of reply region `name` of channel `owner`'s client, or None (none, not
        that client's, or too small): a client can only have its own regions written."""
        if owner is None or name is None:
            return None
        with self._lock:
            region = self._regions.get(owner, {}).get(name)
        if region is None or region.capacity < nbytes:
            return None
        return region.buffer.narrow(0, 0, nbytes)

    def detach(self, name: str) -> None:
        """Forget channel `name` (with its regions), or reply region `name`."""
        with self._lock:
            self._regions.pop(name, None)
            for owned in self._regions.values():
                owned.pop(name, None)
            entry = self._channels.pop(name, None)
        if entry is not None and entry[1] is not None:
            entry[1].close()

    def room(self, name: str | None, nbytes: int) -> torch.Tensor | None:
        """The first `nbytes` of channel `name`, or None (no channel, unknown, or too small)."""
        if name is None:
            return None
        with self._lock:
            entry = self._channels.get(name)
            if entry is not None:
                self._channels.move_to_end(name)
        if entry is None or entry[0].capacity < nbytes:
            return None
        return entry[0].buffer.narrow(0, 0, nbytes)

    def __len__(self) -> int:
        return len(self._channels)
