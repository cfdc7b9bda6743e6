"""The sharded dock: same calls and guarantees as one dock, rows spread over shard actors."""

from __future__ import annotations

import math
import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from tests_support_ray import kill_and_wait  # noqa: E402

from entrepot.dock import (  # noqa: E402
    DockClient,
    DockShardLostError,
    DockStateError,
    DockTimeout,
    DuplicateIndexError,
    ExperienceDock,
    GRPODock,
    GRPODockClient,
    LeaseError,
    LossyDtypeError,
    NotReadyError,
    Padding,
    UnknownColumnError,
)
from entrepot.dock._checks import get_request  # noqa: E402
from entrepot.dock.sharded import ShardedDockClient  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # a Ray of 2 CPUs (conftest)


def _sequences(rows: torch.Tensor) -> list[torch.Tensor]:
    return [torch.full((int(r) % 5 + 1,), int(r)) for r in rows]


def test_same_results_as_one_dock_padded_packed_grouped_and_explicit():
    kwargs = {"prompts_num": 8, "n_samples_per_prompt": 2}
    sharded = ShardedDockClient.launch(GRPODock, shards=3, **kwargs)
    single = GRPODock(**kwargs)
    assert isinstance(sharded, GRPODockClient) and isinstance(sharded, DockClient)
    prompts = [torch.arange(n + 1) for n in range(6)]
    rows = sharded.put_prompts(prompts, 2)
    # spread round robin over the shards (blocks of 3, 3, 2 groups): the first groups of each shard
    assert sorted(set((rows // 2).tolist())) == [0, 1, 3, 4, 6, 7]
    single.put(
        {
            "prompts": _fan(prompts),
            "prompt_length": torch.tensor([len(p) for p in prompts]).repeat_interleave(2),
        },
        rows,
    )
    for layout in ("padded", "packed"):
        a = sharded.peek(["prompts", "prompt_length"], rows, layout=layout)
        b = single.peek(["prompts", "prompt_length"], rows, layout=layout)
        assert torch.equal(a.indexes, b.indexes)
        for name in ("prompts", "prompt_length"):
            assert torch.equal(a.data[name], b.data[name]), (layout, name)
    got = sharded.get("actor_rollout", ["prompts"], 12, layout="packed")
    assert got.indexes.tolist() == rows.sort().values.tolist()  # fifo: ascending, across 3 shards
    responses = _sequences(got.indexes)
    sharded.put({"responses": responses, "rm_scores": got.indexes.float()}, got.indexes)
    explicit = torch.tensor([13, 0, 7, 2])
    columns = ["responses", "rm_scores"]
    batch = sharded.get("actor_train", columns, 4, indexes=explicit, padding=Padding(multiple=4))
    assert batch.indexes.tolist() == explicit.tolist()  # the caller's order, rows from several shards
    assert batch.data["rm_scores"].tolist() == [13.0, 0.0, 7.0, 2.0]
    assert batch.lengths["responses"].tolist() == [4, 1, 3, 3] and batch.data["responses"].shape == (4, 4)
    assert batch.data["responses"][2, :3].tolist() == [7, 7, 7] and batch.data["responses"][2, 3] == 0
    with pytest.raises(NotReadyError, match="old_log_prob"):
        sharded.peek(["old_log_prob"], [0])
    assert sharded.put_prompts([], 2).tolist() == single.put_prompts([], 2).tolist() == []  # nothing to put
    metrics = sharded.metrics()
    assert metrics["dock/shards"] == 3 and metrics["dock/bytes_stored"] > 0


def _fan(prompts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p for p in prompts for _ in range(2)]


def test_errors_name_the_column_and_change_nothing():
    dock = ShardedDockClient.launch(ExperienceDock, shards=2, capacity=8, columns=["x", "s"], consumers=["c"])
    dock.put(
        {"x": _sequences(torch.arange(4)).copy(), "s": torch.arange(4, dtype=torch.int32)}, torch.arange(4)
    )
    with pytest.raises(UnknownColumnError, match="nope"):
        dock.put({"nope": torch.ones(1)}, [5])
    with pytest.raises(LossyDtypeError, match="'s'"):
        dock.put({"s": torch.ones(1)}, [5])  # float into an int32 column
    with pytest.raises(DuplicateIndexError):
        dock.put({"s": torch.ones(2, dtype=torch.int32)}, [5, 5])
    assert dock.progress("c") == {"consumed": 0, "live": 4}  # the failed puts stored nothing
    dock.put({"s": torch.tensor([7], dtype=torch.int16)}, [6])  # lossless: stored as int32 in shard 1
    assert dock.peek(["s"], [6, 0]).data["s"].dtype == torch.int32
    with pytest.raises(DockTimeout):
        dock.get("c", ["x"], 8, timeout=0.2)
    assert dock.get("c", ["x", "s"], 8, min_count=1).indexes.tolist() == [0, 1, 2, 3]


def test_leases_come_back_and_acking_puts_commit_together():
    dock = ShardedDockClient.launch(
        ExperienceDock, shards=2, capacity=8, columns=["x", "y"], consumers=["c", "d"]
    )
    dock.put({"x": _sequences(torch.arange(8))}, torch.arange(8))
    first = dock.get("c", ["x"], 8, lease=0.3)
    assert first.lease is not None and len(first) == 8
    time.sleep(0.5)
    again = dock.get("c", ["x"], 8, lease=math.inf, timeout=5)  # the expired lease gave them back
    assert again.indexes.tolist() == list(range(8))
    with pytest.raises(LeaseError):
        dock.put({"y": torch.ones(8)}, torch.arange(8), ack=first.lease)
    dock.put({"y": torch.ones(8)}, torch.arange(8), ack=again.lease)
    assert dock.all_consumed("c") and dock.progress("d") == {"consumed": 0, "live": 8}


@ray.remote(num_cpus=0.1)
class Producer:
    def __init__(self, client: ShardedDockClient) -> None:
        torch.set_num_threads(1)
        self.client = client

    def produce(self, rows: list[int]) -> int:
        for start in range(0, len(rows), 96):
            chunk = torch.tensor(rows[start : start + 96])
            self.client.put({"x": _sequences(chunk)}, chunk)
        return len(rows)


@ray.remote(num_cpus=0.1)
class Consumer:
    def __init__(self, client: ShardedDockClient) -> None:
        torch.set_num_threads(1)
        self.client = client

    def consume(self, name: str) -> list[int]:
        seen: list[int] = []
        while (batch := self.client.get(name, ["x", "id"], 64, min_count=1, timeout=60)) is not None:
            rows = batch.indexes
            # `columns`, not `data`: a TensorDict would import torch._dynamo in every actor (seconds each)
            assert torch.equal(batch.columns["id"], rows)
            assert torch.equal(batch.lengths["x"], rows % 5 + 1)
            assert torch.equal(batch.columns["x"][:, 0], rows)
            seen += rows.tolist()
        return seen


def test_many_producers_and_consumers_across_shards_exactly_once():
    num_rows, consumers = 1536, ["a", "b"]  # 6 puts per producer, ~12 gets per reader: still racing
    dock = ShardedDockClient.launch(ExperienceDock, shards=4, capacity=num_rows, columns=["x", "id"],
                                    consumers=consumers)  # fmt: skip
    dock.put({"id": torch.arange(num_rows)}, torch.arange(num_rows))  # rows exist; x comes from producers
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(0))
    producers = [Producer.remote(dock) for _ in range(3)]
    readers = [Consumer.remote(dock) for _ in range(4)]  # two per consumer, racing for rows
    made = [p.produce.remote(part.tolist()) for p, part in zip(producers, order.chunk(3), strict=True)]
    seen = [r.consume.remote(consumers[i % 2]) for i, r in enumerate(readers)]
    assert sum(ray.get(made)) == num_rows
    results = ray.get(seen, timeout=180)
    for k, name in enumerate(consumers):
        rows = sorted(results[k] + results[k + 2])
        assert rows == list(range(num_rows)), f"{name}: lost or duplicated rows"
        assert dock.all_consumed(name)


def test_save_and_load_into_another_number_of_shards(tmp_path):
    kwargs = {"prompts_num": 6, "n_samples_per_prompt": 2, "max_age": 3}
    dock = ShardedDockClient.launch(GRPODock, shards=3, **kwargs)
    rows = dock.put_prompts([torch.arange(3), torch.arange(2), torch.arange(4)], 2)
    batch = dock.get("actor_rollout", ["prompts"], 6)
    dock.put({"responses": _sequences(batch.indexes)}, batch.indexes, completed=[True] * 4 + [False] * 2)
    dock.save(str(tmp_path / "dock.pt"))
    for shards in (2, 1):  # saved from 3 shards
        back = ShardedDockClient.launch(GRPODock, shards=shards, **kwargs)
        back.load(str(tmp_path / "dock.pt"))
        for layout in ("packed", "padded"):
            a = back.peek(["prompts", "responses"], rows, layout=layout)
            b = dock.peek(["prompts", "responses"], rows, layout=layout)
            assert all(torch.equal(a.data[name], b.data[name]) for name in ("prompts", "responses"))
        assert back.finished_rows().tolist() == dock.finished_rows().tolist()
        assert back.progress("actor_rollout") == dock.progress("actor_rollout")
        if shards > 1:
            back.close()
    (tmp_path / "dock.pt").write_bytes(b"garbage")
    with pytest.raises(DockStateError, match=r"dock\.pt"):
        back.load(str(tmp_path / "dock.pt"))
    assert back.finished_rows().tolist() == dock.finished_rows().tolist()  # the bad file changed nothing


def test_a_lost_shard_names_its_node_and_the_get_gives_its_rows_back():
    dock = ShardedDockClient.launch(ExperienceDock, shards=2, capacity=8, columns=["x"], consumers=["c"])
    dock.put({"x": _sequences(torch.arange(8))}, torch.arange(8))
    kill_and_wait(dock.shards[1])
    node = ray.get_runtime_context().get_node_id()[:12]
    with pytest.raises(DockShardLostError, match=f"shard 1 on node .*{node}"):
        dock.get("c", ["x"], 8)
    assert dock.progress("c") == {"consumed": 0, "live": 8}  # nothing was consumed by the failed get
    served = dock.get("c", ["x"], 4, indexes=[0, 1, 2, 3])
    assert served.indexes.tolist() == [0, 1, 2, 3]  # shard 0 still serves
    kill_and_wait(dock.controller)
    with pytest.raises(DockShardLostError, match=f"controller on node .*{node}"):
        dock.progress("c")


def test_a_get_takes_rows_of_its_own_nodes_shards_first():
    """The controller in-process (its calls are plain methods): shard 0 on node A, shards 1-2 on node B."""
    from entrepot.dock.sharded import ShardController

    shard_of_group = torch.tensor([0, 0, 1, 1, 2, 2])  # 6 groups of 2 rows
    controller = ShardController(GRPODock, {"prompts_num": 6, "n_samples_per_prompt": 2}, shard_of_group,
                                 ["node-a", "node-b", "node-b"])  # fmt: skip
    rows = torch.arange(12)
    kinds = {"prompts": (torch.int64, False)}
    controller.prepare_put(kinds, rows, None)
    controller.commit_put({"prompts": torch.full((12,), 3)}, rows, None, None, False)

    def take(consumer: str, columns: list[str], count: int, node: str) -> torch.Tensor:
        return controller.take(get_request(consumer, columns, count), node)[0]

    b = take("actor_rollout", ["prompts"], 4, "node-b")
    assert b.tolist() == [4, 5, 6, 7]  # node B's shards hold rows 4-11: its first free groups
    assert take("actor_rollout", ["prompts"], 4, "node-a").tolist() == [0, 1, 2, 3]  # shard 0
    assert take("actor_rollout", ["prompts"], 4, "node-a").tolist() == [
        8,
        9,
        10,
        11,
    ]  # A has none left
    assert take("ref_log_prob", ["prompts"], 12, "node-c").tolist() == list(range(12))  # no shard on C
