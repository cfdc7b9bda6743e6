"""A sharded dock's client on its shards' node: rows through same-node channels, calls over their links.

The same results as one dock, each row once, batches that later calls do not change, a dropped
channel's call sent through Ray (and a new channel after it), a lost shard named with its node.
"""

from __future__ import annotations

import os

import pytest
import torch

ray = pytest.importorskip("ray")

from tests_support_ray import kill_and_wait  # noqa: E402

from entrepot.dock import DockShardLostError, ExperienceDock, UnknownColumnError  # noqa: E402
from entrepot.dock._channel import names_made_by  # noqa: E402
from entrepot.dock.sharded import ShardedDockClient  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # a Ray of 2 CPUs (conftest)

CAPACITY = 256


def _long_rows(rows: torch.Tensor) -> dict[str, object]:
    """Rows of 4,096-6,000 int64 tokens (32-48 KB each): a 32-row part of a call is over 1 MiB."""
    return {"x": [torch.full((4096 + int(r) * 61 % 1904,), int(r)) for r in rows], "id": rows.clone()}


def _same_batch(got, want) -> None:
    assert got.layout == want.layout and torch.equal(got.indexes, want.indexes)
    for name, column in want.columns.items():
        assert torch.equal(got.columns[name], column), name
    assert all(torch.equal(got.lengths[name], lengths) for name, lengths in want.lengths.items())


def _leftovers() -> list[str]:
    """The names this process's clients made that are still there (not another run's on this machine)."""
    return names_made_by(os.getpid())


def test_puts_and_gets_through_each_shards_channel_match_one_dock():
    before = _leftovers()
    local = ExperienceDock(CAPACITY, columns=["x", "id"], consumers=["c"])
    sharded = ShardedDockClient.launch(ExperienceDock, shards=2, capacity=CAPACITY, columns=["x", "id"],
                                       consumers=["c"], n_samples_per_prompt=8)  # fmt: skip
    assert sharded.shard_of_group.tolist() == [0] * 16 + [1] * 16  # rows 0-127 in shard 0
    for start, stop in ((0, 96), (96, 192), (192, 256)):  # the 2nd put has a part in each shard
        rows = torch.arange(start, stop)
        local.put(_long_rows(rows), rows)
        sharded.put(_long_rows(rows), rows)
    # Each shard's first part went through Ray and made its channel; the later parts took them.
    assert all(capacity > 0 for capacity in sharded.channel_capacities), sharded.channel_capacities
    assert sharded.channel_writes == 2
    assert sharded._router._controller_link._connection is not None  # its calls skip Ray too

    got = []
    for layout in ("padded", "packed", "padded"):
        want = local.get("c", ["x", "id"], 48, layout=layout)
        got.append((sharded.get("c", ["x", "id"], 48, layout=layout), want))
        _same_batch(*got[-1])
    for batch, want in got:  # copies: later calls through the same channels changed none
        _same_batch(batch, want)
    assert sharded.channel_reads == 4  # the 3rd get had a part in each shard

    with pytest.raises(UnknownColumnError, match="'nope'"):
        sharded.get("c", ["nope"], 8)  # refused before any shard is asked
    peeked = sharded.peek(["x", "id"], [200, 3, 100])
    _same_batch(peeked, local.peek(["x", "id"], [200, 3, 100]))

    # A shard that drops its channel (as after a restart): the next read goes through Ray, then a
    # new channel (never smaller than the dropped one) carries the calls again.
    # Rows 144-255 are left, all in shard 1.
    assert ray.get(sharded.shards[1].node_id.remote()) == ray.get_runtime_context().get_node_id()
    old, reads = sharded._router._channels[1]._current, sharded.channel_reads
    ray.get(sharded.shards[1].detach_channel.remote(old.name))
    _same_batch(sharded.get("c", ["x", "id"], 48), local.get("c", ["x", "id"], 48))
    assert sharded.channel_reads == reads  # its link was closed: through Ray
    assert sharded.channel_capacities[1] >= old.capacity and sharded._router._channels[1]._current is not old
    rest = sharded.get("c", ["x", "id"], CAPACITY)
    _same_batch(rest, local.get("c", ["x", "id"], CAPACITY))
    assert sharded.channel_reads == reads + 1 and sharded.get("c", ["x"], 1) is None  # each row once
    assert _leftovers() == before  # unlinked once both sides mapped them


def test_a_lost_shard_with_a_channel_is_named_and_the_get_gives_its_rows_back():
    sharded = ShardedDockClient.launch(ExperienceDock, shards=2, capacity=128, columns=["x", "id"],
                                       consumers=["c"], n_samples_per_prompt=8)  # fmt: skip
    for start in (0, 64):  # one put per shard, each ~2.6 MB: a channel to each follows
        rows = torch.arange(start, start + 64)
        sharded.put(_long_rows(rows), rows)
    assert all(capacity > 0 for capacity in sharded.channel_capacities)
    kill_and_wait(sharded.shards[1])
    node = ray.get_runtime_context().get_node_id()[:12]
    with pytest.raises(DockShardLostError, match=f"shard 1 on node .*{node}"):
        sharded.get("c", ["x", "id"], 128)  # shard 0 answers over its link, shard 1's link closed
    assert sharded.progress("c") == {"consumed": 0, "live": 128}  # the failed get gave its rows back
    served = sharded.get("c", ["x", "id"], 64, indexes=range(64))
    assert served.indexes.tolist() == list(range(64))  # shard 0 still serves, over its link
