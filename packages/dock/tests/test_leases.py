"""Leases: a consumer dying after a get loses nothing, acks are exactly-once, a failed get takes nothing."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import replace

import pytest
import torch

import entrepot.dock._dock as dock_module
from entrepot.dock import ExperienceDock, InvalidArgumentError, Lease, LeaseError


def _dock(rows: int = 8) -> ExperienceDock:
    dock = ExperienceDock(rows, columns=["x", "y"], consumers=["a", "b"])
    dock.put({"x": torch.arange(rows)}, torch.arange(rows))
    return dock


def test_leased_rows_are_held_until_acked_and_then_consumed():
    dock = _dock()
    first = dock.get("a", ["x"], 4, lease=math.inf)
    assert first is not None and first.lease is not None and first.lease.consumer == "a"
    assert dock.progress("a") == {"consumed": 0, "live": 8}  # leased, not consumed
    second = dock.get("a", ["x"], 4, lease=math.inf)
    assert second is not None and torch.equal(second.indexes, torch.arange(4, 8))  # never the held rows
    dock.ack(first.lease)
    dock.put({"y": torch.ones(4)}, second.indexes, ack=second.lease)
    assert dock.progress("a") == {"consumed": 8, "live": 8}
    assert dock.get("a", ["x"], 4) is None
    assert dock.get("b", ["x"], 8) is not None  # another consumer is untouched


def test_a_lease_that_expires_or_is_released_hands_its_rows_back():
    dock = _dock()
    dead = dock.get("a", ["x"], 4, lease=0.2)
    assert dead is not None and dead.lease is not None
    released = dock.get("a", ["x"], 4, lease=math.inf)
    assert released is not None and released.lease is not None
    assert dock.release(released.lease) == 4
    assert dock.release(released.lease) == 0  # idempotent
    again = dock.get("a", ["x"], 4)
    assert again is not None and torch.equal(again.indexes, released.indexes)
    started = time.monotonic()
    late = dock.get("a", ["x"], 4, timeout=10)  # waits for the expiry, not for the timeout
    assert late is not None and torch.equal(late.indexes, dead.indexes)
    assert time.monotonic() - started < 5
    with pytest.raises(LeaseError, match=f"lease {dead.lease.id} of consumer 'a'"):
        dock.ack(dead.lease)  # too late: the rows went to someone else
    metrics = dock.metrics()
    assert metrics["dock/rows_returned/a"] == 8 and metrics["dock/leases_expired/a"] == 1
    assert metrics["dock/rows_leased/a"] == 0


def test_a_put_with_a_stale_lease_stores_nothing():
    dock = _dock()
    batch = dock.get("a", ["x"], 4, lease=math.inf)
    assert batch is not None and batch.lease is not None
    dock.release(batch.lease)
    with pytest.raises(LeaseError):
        dock.put({"y": torch.ones(4)}, batch.indexes, ack=batch.lease)
    assert dock.metrics()["dock/rows_ready/y"] == 0
    fresh = dock.get("a", ["x"], 4, lease=math.inf)
    assert fresh is not None and fresh.lease is not None
    with pytest.raises(LeaseError, match="does not hold row 4"):
        dock.put({"y": torch.ones(5)}, torch.arange(5), ack=fresh.lease)  # row 4 is not in this lease
    assert dock.metrics()["dock/rows_ready/y"] == 0
    dock.ack(fresh.lease, [0, 1])  # part of a lease
    dock.ack(fresh.lease, [2, 3])
    assert dock.progress("a")["consumed"] == 4


def test_a_lease_key_makes_a_retried_get_return_the_same_rows():
    dock = _dock()
    first = dock.get("a", ["x"], 4, lease=60, lease_key="task-7")
    retry = dock.get("a", ["x"], 4, lease=60, lease_key="task-7")
    assert first is not None and retry is not None
    assert torch.equal(first.indexes, retry.indexes) and first.lease == retry.lease
    other = dock.get("a", ["x"], 4, lease=60, lease_key="task-8")
    assert other is not None and not set(other.indexes.tolist()) & set(first.indexes.tolist())
    dock.ack(retry.lease)
    assert dock.get("a", ["x"], 4, lease=60, lease_key="task-7") is None  # done: nothing to redo
    dock.clear()
    dock.put({"x": torch.arange(8)}, torch.arange(8))
    reused = dock.get("a", ["x"], 4, lease=60, lease_key="task-7")  # a new iteration may reuse keys
    assert reused is not None and len(reused) == 4


def test_clear_ends_leases_and_bad_arguments_are_refused():
    dock = _dock()
    batch = dock.get("a", ["x"], 4, lease=math.inf)
    assert batch is not None and batch.lease is not None
    dock.clear()
    with pytest.raises(LeaseError, match="cleared"):
        dock.ack(batch.lease)
    for bad in (0, -1.0, math.nan):
        with pytest.raises(InvalidArgumentError, match="lease must be"):
            dock.get("a", ["x"], 4, lease=bad)
    with pytest.raises(InvalidArgumentError, match="needs a lease"):
        dock.get("a", ["x"], 4, lease_key="k")


def test_a_lease_is_bound_to_its_consumer_and_to_the_dock_that_issued_it():
    """A relabelled ack once settled a's lease as b's: a got its rows twice and b never. Now an ack,
    put or release naming a lease this dock did not issue as it is raises and changes nothing."""
    dock = _dock()
    held = dock.get("a", ["x"], 4, lease=math.inf)
    assert held is not None and held.lease is not None
    before = dock.state_dict(), dock.metrics()
    other_dock = _dock()
    elsewhere = other_dock.get("a", ["x"], 4, lease=math.inf)
    assert elsewhere is not None and elsewhere.lease is not None and elsewhere.lease.id != held.lease.id
    forged = [
        replace(held.lease, consumer="b"),  # relabelled to another consumer
        Lease(held.lease.id, "a", math.inf),  # the id alone, guessed from the counter
        replace(held.lease, token=held.lease.token[::-1]),  # a made-up token
        replace(held.lease, seconds=1.0),  # altered
        replace(elsewhere.lease, id=held.lease.id),  # another dock's, with this dock's id
    ]
    for lease in forged:
        with pytest.raises(LeaseError, match="did not issue it as given"):
            dock.ack(lease)
        with pytest.raises(LeaseError, match="did not issue it as given"):
            dock.put({"y": torch.ones(4)}, held.indexes, ack=lease)
        with pytest.raises(LeaseError, match="did not issue it as given"):
            dock.release(lease)
    assert torch.equal(dock.state_dict()["consumed"], before[0]["consumed"]) and dock.metrics() == before[1]
    assert dock.get("b", ["x"], 8) is not None  # b receives all 8 rows: none was settled as b's
    rest = dock.get("a", ["x"], 8)
    assert rest is not None and rest.indexes.tolist() == [4, 5, 6, 7]  # a never receives its 4 rows twice
    dock.ack(held.lease)  # the genuine lease still works, once
    assert dock.release(held.lease) == 0  # settled: nothing left to hand back (idempotent)
    with pytest.raises(LeaseError, match="expired, was released or acked"):
        dock.ack(held.lease)
    assert dock.get("a", ["x"], 8) is None
    assert len(held.lease.token) == 64 and held.lease.token not in repr(held.lease)


@pytest.mark.parametrize("lease", [None, math.inf])
def test_a_get_that_fails_after_picking_rows_takes_nothing(monkeypatch, lease):
    dock = _dock()

    def broken(*args, **kwargs):
        raise MemoryError("out of memory while laying out the batch")

    with monkeypatch.context() as patch:
        patch.setattr(dock_module, "build_batch", broken)  # fails after the rows were picked
        with pytest.raises(MemoryError):
            dock.get("a", ["x"], 8, lease=lease)
    assert dock.progress("a") == {"consumed": 0, "live": 8}
    metrics = dock.metrics()  # the failed get left no trace: it did not happen
    assert metrics["dock/gets"] == 0 and metrics["dock/rows_got/a"] == 0 and metrics["dock/bytes_got/a"] == 0
    assert metrics["dock/rows_returned/a"] == 0 and metrics["dock/rows_leased/a"] == 0
    batch = dock.get("a", ["x"], 8)
    assert batch is not None and torch.equal(batch.indexes, torch.arange(8))


def test_exactly_once_with_consumers_dying_at_random_points():
    """6 consumer threads on 2 consumers over 20,000 rows; each get dies (no ack) with probability 0.1.

    A death is a get whose rows are never acked (the thread goes on as a fresh consumer); its rows
    come back when the lease expires. Before acking, one get in five also tries a relabelled ack (its
    lease as the other consumer's) and a forged one (its id with a made-up token): both must be
    refused. Every row must be acked exactly once per consumer, 0 lost.
    """
    num_rows, consumers = 20_000, ["ref", "train"]
    dock = ExperienceDock(num_rows, columns=["id", "x", "out_ref"], consumers=consumers)
    dock.put({"id": torch.arange(num_rows)}, torch.arange(num_rows))  # rows exist; x comes from producers
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(0))
    acked: dict[str, list[int]] = {name: [] for name in consumers}
    deaths = {name: 0 for name in consumers}
    refused = {name: 0 for name in consumers}
    forgeries = {name: 0 for name in consumers}  # relabelled and forged acks tried, each refused
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(part: torch.Tensor) -> None:
        try:
            for chunk in part.split(500):
                dock.put({"x": (torch.repeat_interleave(chunk, chunk % 5 + 1), chunk % 5 + 1)}, chunk)
        except BaseException as error:
            errors.append(error)

    def consume(name: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            while (
                batch := dock.get(name, ["x"], rng.randint(1, 300), min_count=1, lease=0.05, timeout=60)
            ) is not None:
                assert batch.lease is not None
                assert torch.equal(batch.lengths["x"], batch.indexes % 5 + 1)
                if rng.random() < 0.1:  # dies here: the rows stay leased until the lease runs out
                    with lock:
                        deaths[name] += 1
                    continue
                if rng.random() < 0.2:  # another consumer's ack of these rows, or a forged one
                    other = consumers[1 - consumers.index(name)]
                    for fake in (replace(batch.lease, consumer=other), replace(batch.lease, token="0" * 64)):
                        try:
                            dock.ack(fake)
                        except LeaseError:
                            with lock:
                                forgeries[name] += 1
                        else:
                            raise AssertionError(f"a forged ack {fake} was accepted")
                try:
                    if name == "ref":  # outputs and ack in one call
                        dock.put({"out_ref": batch.indexes.float()}, batch.indexes, ack=batch.lease)
                    else:
                        dock.ack(batch.lease)
                except LeaseError:  # too slow: the lease expired and the rows went to someone else
                    with lock:
                        refused[name] += 1
                    continue
                with lock:
                    acked[name].extend(batch.indexes.tolist())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(part,)) for part in order.chunk(4)]
    threads += [
        threading.Thread(target=consume, args=(name, 10 * i + j))
        for i, name in enumerate(consumers)
        for j in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]
    for name in consumers:
        got = torch.tensor(acked[name])
        assert got.numel() == num_rows, f"{name}: {num_rows - got.numel()} rows lost or duplicated"
        assert torch.equal(got.sort().values, torch.arange(num_rows)), f"{name}: a row acked twice"
        assert deaths[name] > 0 and forgeries[name] > 0
    ref = dock.peek(["out_ref"], torch.arange(num_rows))
    assert torch.equal(ref.data["out_ref"], torch.arange(num_rows).float())
    print(
        f"rows {num_rows} x {len(consumers)} consumers, deaths {deaths}, late acks refused {refused}, "
        f"forged acks refused {forgeries}, lost 0"
    )
