"""The actor's side of same-node channels: the channels a dock actor (or shard) has mapped, and
the link each one's calls come over (see _channel and _link)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from entrepot.dock import _channel, _link


class ChannelTable:
    """The channels an actor has mapped, by name, each with the link its calls come over (see _link).

    A channel goes when its client closes the link, or (least recently used first) past `limit`
    channels: its link is closed between two calls, and the client makes another.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._channels: OrderedDict[str, tuple[_channel.Channel, _link.Server | None]] = OrderedDict()
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
                evicted.append(self._channels.popitem(last=False)[1][1])
        for old in evicted:
            if old is not None:
                old.close()  # its client falls back to Ray and makes another

    def detach(self, name: str) -> None:
        with self._lock:
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
