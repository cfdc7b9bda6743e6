"""The dock as a Ray actor: same API, errors cross intact, several client actors get each row once."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

ray = pytest.importorskip("ray")

from tests_support_ray import kill_and_wait  # noqa: E402

from entrepot.dock import (  # noqa: E402
    DockClient,
    DockError,
    DockShardLostError,
    DockStateError,
    ExperienceDock,
    GRPODock,
    GRPODockClient,
    InvalidArgumentError,
    Lease,
    LeaseError,
    Padding,
    UnknownColumnError,
)
from entrepot.dock._channel import names_made_by  # noqa: E402
from entrepot.dock.ray import RayDockClient  # noqa: E402

# Client actors are defined here; ship this module's code to the workers by value (pytest's importlib
# mode gives it a name the workers cannot import).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # a Ray of 2 CPUs (conftest)


@ray.remote(num_cpus=0.25)
class Producer:
    def __init__(self, client: RayDockClient) -> None:
        torch.set_num_threads(1)
        self.client = client

    def produce(self, rows: list[int]) -> int:
        for start in range(0, len(rows), 128):
            chunk = torch.tensor(rows[start : start + 128])
            self.client.put({"x": [torch.full((int(r) % 5 + 1,), int(r)) for r in chunk]}, chunk)
        return len(rows)


@ray.remote(num_cpus=0.25)
class Consumer:
    def __init__(self, client: RayDockClient) -> None:
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


def test_grpo_dock_actor_round_trip_errors_and_state(tmp_path):
    client = RayDockClient.launch(GRPODock, prompts_num=2, n_samples_per_prompt=2, files_root=str(tmp_path))
    assert isinstance(client, DockClient) and isinstance(client, GRPODockClient)
    rows = client.put_prompts([torch.tensor([1, 2]), torch.tensor([3])], 2)
    assert rows.tolist() == [0, 1, 2, 3]
    batch = client.get("actor_rollout", ["prompts"], 4, layout="packed")
    assert batch.data["prompts"].tolist() == [1, 2, 1, 2, 3, 3]
    responses = [torch.arange(3), torch.arange(5), torch.arange(1), torch.arange(2)]
    client.put({"responses": responses, "rm_scores": torch.tensor([1.0, 2.0, 3.0, 4.0])}, rows)
    logp = torch.ones(4, 5, dtype=torch.bfloat16)
    client.put({"old_log_prob": (logp, torch.tensor([3, 5, 1, 2]))}, rows)
    columns = ["responses", "old_log_prob", "rm_scores"]
    batch = client.get("actor_train", columns, 4, padding=Padding(multiple=4))
    assert batch.data["responses"].shape == (4, 8) and batch.data["responses"][1, :5].tolist() == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert batch.data["old_log_prob"].dtype == torch.bfloat16 and batch.lengths["old_log_prob"].tolist() == [
        3,
        5,
        1,
        2,
    ]
    assert batch.data["rm_scores"].tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(UnknownColumnError, match="'nope'"):
        client.put({"nope": torch.ones(1)}, [2])
    with pytest.raises(DockError, match="already received row 0"):
        client.get("actor_train", ["responses"], 2, indexes=[0, 1])
    assert client.progress("actor_train") == {"consumed": 4, "live": 4}
    assert client.get("actor_train", ["responses"], 2) is None and client.all_consumed("actor_train")
    assert client.metrics()["dock/rows_got/actor_train"] == 4
    client.save(str(tmp_path / "dock.pt"))
    client.reset()
    assert client.progress("actor_rollout")["live"] == 0
    client.load(str(tmp_path / "dock.pt"))
    assert client.progress("actor_rollout") == {"consumed": 4, "live": 4}


def test_the_actor_runs_only_its_public_control_methods_and_files_under_its_root(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    client = RayDockClient.launch(GRPODock, prompts_num=2, n_samples_per_prompt=2, files_root=str(root))
    client.put_prompts([torch.tensor([1, 2]), torch.tensor([3])], 2)
    for method in ("_init_state", "__init__", "state_dict", "no_such_method"):  # private or not allowed
        with pytest.raises(InvalidArgumentError, match=f"dock method '{method}' cannot be called"):
            client._call(method)
    assert client.progress("actor_rollout")["live"] == 4  # nothing was run: the rows are intact
    for path in ("../outside.pt", str(tmp_path / "outside.pt"), "/etc/passwd"):
        with pytest.raises(InvalidArgumentError, match="outside the dock's files_root"):
            client.save(path)
        with pytest.raises(InvalidArgumentError, match="outside the dock's files_root"):
            client.load(path)
    (root / "escape").symlink_to(tmp_path)  # a link out of the root is followed before the check
    with pytest.raises(InvalidArgumentError, match="outside the dock's files_root"):
        client.save("escape/outside.pt")
    assert not (tmp_path / "outside.pt").exists()
    client.save("dock.pt")  # relative paths are taken from the root
    assert (root / "dock.pt").is_file()
    unrooted = RayDockClient.launch(GRPODock, prompts_num=2, n_samples_per_prompt=2)
    with pytest.raises(InvalidArgumentError, match="needs the actor launched with files_root="):
        unrooted.save(str(root / "other.pt"))


def test_a_corrupt_dock_file_fails_its_load_through_ray_with_dock_state_error(tmp_path):
    client = RayDockClient.launch(GRPODock, prompts_num=2, n_samples_per_prompt=2, files_root=str(tmp_path))
    client.put_prompts([torch.tensor([1, 2]), torch.tensor([3])], 2)
    client.save("dock.pt")
    data = bytearray((tmp_path / "dock.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    (tmp_path / "dock.pt").write_bytes(bytes(data))
    client.reset()
    with pytest.raises(
        DockStateError, match=r"^dock file '.*dock\.pt': sha256 \w+ does not match its manifest"
    ):
        client.load("dock.pt")  # the actor's own error, not Ray's wrapper with the actor's traceback
    assert client.progress("actor_rollout")["live"] == 0  # the failed load left the reset dock alone


def test_client_actors_each_row_exactly_once():
    num_rows = 2048  # 8 puts from each producer, ~16 gets of 64 per consumer actor: still racing
    client = RayDockClient.launch(
        ExperienceDock, capacity=num_rows, columns=["id", "x"], consumers=["a", "b"]
    )
    client.put({"id": torch.arange(num_rows)}, torch.arange(num_rows))
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(0)).tolist()
    producer = Producer.remote(client)
    consumers = [Consumer.remote(client) for _ in range(2)]
    done = producer.produce.remote(order[::2])
    seen = [c.consume.remote("a") for c in consumers]
    for start in range(0, num_rows // 2, 128):  # the driver is the second producer
        chunk = torch.tensor(order[1::2][start : start + 128])
        client.put({"x": [torch.full((int(r) % 5 + 1,), int(r)) for r in chunk]}, chunk)
    seen_b = client_drain(client, "b")
    assert ray.get(done) == num_rows // 2
    rows_a = [r for part in ray.get(seen) for r in part]
    assert sorted(rows_a) == list(range(num_rows))  # two actors sharing consumer "a": each row once
    assert sorted(seen_b) == list(range(num_rows))


def client_drain(client: RayDockClient, name: str) -> list[int]:
    seen: list[int] = []
    while (batch := client.get(name, ["x"], 256, min_count=1, layout="packed", timeout=60)) is not None:
        seen += batch.indexes.tolist()
    return seen


@ray.remote(num_cpus=0.25, max_retries=3)
def _consumer_task_that_dies_once(client: RayDockClient, marker: str, key: str | None) -> list[int]:
    """Gets 32 rows under a lease; its first attempt dies right after the get (Ray retries the task)."""
    import os

    torch.set_num_threads(1)
    batch = client.get("c", ["x"], 32, lease=1.0, lease_key=key, timeout=30)
    assert batch is not None and batch.lease is not None
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)  # the worker process dies holding the rows
    client.put({"y": batch.indexes.float()}, batch.indexes, ack=batch.lease)
    return batch.indexes.tolist()


@pytest.mark.parametrize("key", ["step3-rank0", None])
def test_a_retried_ray_task_loses_no_rows(tmp_path, key):
    """With a lease key the retry gets the same rows at once; without one, when the lease expires."""
    client = RayDockClient.launch(ExperienceDock, capacity=32, columns=["x", "y"], consumers=["c"])
    client.put({"x": torch.arange(32)}, torch.arange(32))
    rows = ray.get(_consumer_task_that_dies_once.remote(client, str(tmp_path / "died"), key))
    assert (tmp_path / "died").exists()  # the first attempt did die
    assert sorted(rows) == list(range(32))
    assert client.progress("c") == {"consumed": 32, "live": 32}
    assert client.get("c", ["x"], 32) is None
    assert torch.equal(client.peek(["y"], torch.arange(32)).data["y"], torch.arange(32).float())
    with pytest.raises(LeaseError, match="lease 1000000000 of consumer 'c'"):  # typed, through Ray
        client.ack(Lease(id=10**9, consumer="c", seconds=1.0))


def _long_rows(rows: torch.Tensor) -> dict[str, object]:
    """Rows of 4,096-6,000 int64 tokens (32-48 KB each), so a 64-row get is over 1 MiB."""
    return {"x": [torch.full((4096 + int(r) * 61 % 1904,), int(r)) for r in rows], "id": rows.clone()}


def _same_batch(got, want) -> None:
    assert got.layout == want.layout and torch.equal(got.indexes, want.indexes)
    assert got.columns.keys() == want.columns.keys()
    for name, column in want.columns.items():
        assert torch.equal(got.columns[name], column), name
    assert all(torch.equal(got.lengths[name], lengths) for name, lengths in want.lengths.items())


def _channel_files() -> list[str]:
    """The channel and link names this test process's clients made that are still there (another run
    on this machine has its own: issue 58 saw one fail this check)."""
    return names_made_by(os.getpid())


def test_large_puts_and_gets_go_through_the_shared_memory_channel_as_copies():
    local = ExperienceDock(256, columns=["x", "id"], consumers=["c"])
    client = RayDockClient.launch(ExperienceDock, capacity=256, columns=["x", "id"], consumers=["c"])
    plain = RayDockClient(client.actor, channel=False)  # the same actor, always through Ray
    for rows in (torch.arange(128), torch.arange(128, 256)):  # ~5 MB each
        local.put(_long_rows(rows), rows)
        client.put(_long_rows(rows), rows)
    assert client.channel_puts == 1 and client.channel_capacity > 0  # the 1st put made the channel
    got = []
    for layout in ("padded", "packed", "padded"):
        want = local.get("c", ["x", "id"], 64, layout=layout)
        got.append((client.get("c", ["x", "id"], 64, layout=layout), want))
        _same_batch(*got[-1])
    assert client.channel_gets == 3
    for batch, want in got:  # batches are copies: later calls through the channel changed none
        _same_batch(batch, want)
    assert _channel_files() == []  # unlinked once both sides mapped it
    with pytest.raises(UnknownColumnError, match="'nope'"):
        client.get("c", ["nope"], 8)  # an error in the actor gives the channel back
    with pytest.raises(UnknownColumnError, match="'nope'"):
        client.put({"nope": [torch.ones(200_000)]}, [0])  # through the channel, refused there too
    _same_batch(plain.get("c", ["x", "id"], 16), local.get("c", ["x", "id"], 16))
    assert plain.channel_capacity == 0 and plain.channel_gets == 0
    packed = client.get("c", ["x", "id"], 16, layout="packed")
    _same_batch(packed, local.get("c", ["x", "id"], 16, layout="packed"))
    assert client.channel_gets == 4 and client.channel_puts == 1
    # Once the channel exists, small calls take its link too (no Ray call for a put or get).
    client.reset()
    local.reset()
    for each in (client, local):
        each.put({"x": [torch.ones(3)], "id": torch.tensor([5])}, [5])
    _same_batch(client.get("c", ["x", "id"], 1), local.get("c", ["x", "id"], 1))
    assert client.channel_gets == 5 and client.channel_puts == 2


def test_a_call_the_channel_cannot_take_goes_through_ray_and_a_new_channel_follows():
    local = ExperienceDock(512, columns=["x", "id"], consumers=["c"])
    client = RayDockClient.launch(ExperienceDock, capacity=512, columns=["x", "id"], consumers=["c"])
    for start in range(0, 448, 32):  # ~1.3 MB a put: the 1st through Ray, then a 2 MiB channel
        rows = torch.arange(start, start + 32)
        local.put(_long_rows(rows), rows)
        client.put(_long_rows(rows), rows)
    assert client.channel_puts == 13 and client.channel_capacity == 2 << 20
    for count, via_channel in ((32, 1), (256, 1), (64, 2)):  # 256 rows outgrow the channel
        _same_batch(client.get("c", ["x", "id"], count), local.get("c", ["x", "id"], count))
        assert client.channel_gets == via_channel, count
    assert client.channel_capacity >= 256 * 4096 * 8
    ray.get(client.actor.detach_channel.remote(client._channel._current.name))  # as after an actor restart
    rows = torch.arange(448, 480)
    local.put(_long_rows(rows), rows)
    client.put(_long_rows(rows), rows)  # refused through the unknown channel, sent through Ray
    assert client.channel_puts == 13
    rows = torch.arange(480, 512)
    local.put(_long_rows(rows), rows)
    client.put(_long_rows(rows), rows)  # through the new channel
    assert client.channel_puts == 14
    _same_batch(client.get("c", ["x", "id"], 160), local.get("c", ["x", "id"], 160))  # each row once
    assert client.channel_gets == 3 and client.get("c", ["x"], 1) is None
    assert _channel_files() == []


@ray.remote(num_cpus=0.25)
def _large_gets(client: RayDockClient, count: int) -> tuple[list[int], int]:
    """Gets in another process: the pickled client opens its own channel there."""
    torch.set_num_threads(1)
    seen: list[int] = []
    while (batch := client.get("c", ["x", "id"], count, min_count=1, timeout=30)) is not None:
        assert torch.equal(batch.columns["x"][:, 0], batch.indexes)
        seen += batch.indexes.tolist()
    return seen, client.channel_gets


def test_a_client_pickled_into_a_task_opens_its_own_channel():
    client = RayDockClient.launch(ExperienceDock, capacity=256, columns=["x", "id"], consumers=["c"])
    rows = torch.arange(256)
    client.put(_long_rows(rows), rows)
    assert client.get("c", ["x", "id"], 64) is not None and client.channel_gets == 1
    seen, channel_gets = ray.get(_large_gets.remote(client, 64))
    assert sorted(seen) == list(range(64, 256)) and channel_gets == 2  # its 1st get came through Ray


def test_a_dead_dock_actor_is_named_with_its_node_and_address():
    """Before, a dead actor surfaced as Ray's error alone (entrepot-grpo then blamed the worker that
    called it). Now every call names the dock's actor and its node; a client made from the bare
    handle, which does not know the node, names the address Ray reports."""
    client = RayDockClient.launch(ExperienceDock, capacity=4, columns=["x"], consumers=["c"])
    node_id = ray.get_runtime_context().get_node_id()
    address = ray.util.get_node_ip_address()
    assert client.node == f"{address} (id {node_id[:12]})"
    client.put({"x": torch.arange(4)}, torch.arange(4))
    bare = RayDockClient(client.actor)
    ray.kill(client.actor)
    for call in (
        lambda: client.get("c", ["x"], 4),
        lambda: client.progress("c"),
        lambda: client.put({"x": torch.ones(1)}, [0]),
    ):
        with pytest.raises(
            DockShardLostError, match=rf"dock's actor on node {re.escape(client.node)} is lost"
        ):
            call()
    with pytest.raises(DockShardLostError, match=rf"dock's actor on node {re.escape(address)}"):
        bare.progress("c")
    # A client whose calls go over its channel's link (see _link) names the lost actor the same way.
    linked = RayDockClient.launch(ExperienceDock, capacity=4, columns=["x"], consumers=["c"])
    linked.put({"x": [torch.ones(300_000)]}, [0])  # 2.4 MB: through Ray, then a channel is made
    linked.put({"x": [torch.ones(8)]}, [1])
    assert linked.channel_puts == 1
    kill_and_wait(linked.actor)  # (ray.kill only asks: its process may serve the link a moment longer)
    for call in (lambda: linked.get("c", ["x"], 1), lambda: linked.put({"x": [torch.ones(8)]}, [2])):
        with pytest.raises(
            DockShardLostError, match=rf"dock's actor on node {re.escape(linked.node)} is lost"
        ):
            call()


def test_gets_are_laid_out_in_reply_regions_and_handed_out_as_views_while_their_batch_lives():
    """A get whose batch found no free region (none yet, or all busy) comes in the wire format and
    copied, and the client makes a region (up to 3) for the next: the actor lays the batch out
    there, padded or packed, and the client hands out views of it. A region is busy while any
    tensor of its batch lives, so no held batch ever changes; a dropped batch frees its region."""
    import gc

    local = ExperienceDock(512, columns=["x", "id"], consumers=["c"])
    client = RayDockClient.launch(ExperienceDock, capacity=512, columns=["x", "id"], consumers=["c"])
    for start in range(0, 512, 128):
        rows = torch.arange(start, start + 128)
        local.put(_long_rows(rows), rows)
        client.put(_long_rows(rows), rows)
    padding = Padding(value=-1, multiple=8)
    held, in_regions = [], []
    for layout in ("padded", "padded", "packed", "packed", "padded", "padded", "packed"):
        want = local.get("c", ["x", "id"], 32, layout=layout, padding=padding)
        got = client.get("c", ["x", "id"], 32, layout=layout, padding=padding)
        _same_batch(got, want)
        held.append((got, want))
        in_regions.append(client.region_gets)
    del got
    # copied (a region made) / in region 1 / copied (region 2 made) / in region 2 / copied (region 3)
    # / in region 3 / copied (all three busy)
    assert in_regions == [0, 1, 1, 2, 2, 3, 3]
    column = held[1][0].columns["x"]
    assert column.shape[1] % 8 == 0 and bool((column == -1).any())  # padded in the region
    for got, want in held:  # views of regions that no later get reused
        _same_batch(got, want)
    del held[3]  # the packed batch in region 2: free again
    gc.collect()
    _same_batch(client.get("c", ["x", "id"], 32), local.get("c", ["x", "id"], 32))
    assert client.region_gets == 4
    for got, want in held:
        _same_batch(got, want)
    assert _channel_files() == []
