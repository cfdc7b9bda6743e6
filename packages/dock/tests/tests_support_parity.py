"""The parity harness: the same calls on one dock, a Ray dock and a sharded dock, results compared.

A `Trio` runs every call on a one-process `ExperienceDock`, then on a `RayDockClient` and a
`ShardedDockClient` built with the same arguments; results (indexes, data, lengths, ages, leases),
errors (type and message) and afterwards every status bitmap, the learned column dtypes and the
metrics must be equal (the Ray dock's whole state_dict, data included, is compared).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import ray
import torch
from tests_support_bad_inputs import CATALOGUE, Leases, assert_same_state, check_outcome

from entrepot.dock import Batch, ExperienceDock
from entrepot.dock._ray_client import node_name
from entrepot.dock.ray import DockActor, RayDockClient
from entrepot.dock.sharded import ShardedDockClient

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actor subclass below, for the workers

STATUSES = ("ready", "consumed", "live", "age", "completed", "born")
UNCOMPARED_METRICS = ("dock/bytes_allocated", "dock/shards")  # and dock/wait_s/* (timing)
DOCKS = ("one dock", "the Ray dock", "the sharded dock")


class Each(tuple):
    """One value per dock (in `DOCKS` order); attributes map over all of them.

    Passed as an argument to a `Trio` call, each dock gets its own value (e.g. its own lease).
    """

    def __getattr__(self, name: str) -> Each:
        return Each(getattr(value, name) for value in self)


def each(value: Any) -> Each:
    """The same `value` for every dock (to compare a `Trio` call's results with)."""
    return Each((value,) * len(DOCKS))


def message(error: BaseException) -> str:
    """The error's message; lease ids differ between the docks (each process counts its own)."""
    return re.sub(r"lease \d+", "lease <id>", str(error))


def same_result(one: Any, other: Any, what: str) -> None:
    """Assert two docks' results of one call are equal (batches field by field)."""
    if isinstance(one, Batch):
        assert isinstance(other, Batch), what
        assert one.indexes.tolist() == other.indexes.tolist(), f"{what}: indexes"
        assert one.ages.tolist() == other.ages.tolist(), f"{what}: ages"
        assert one.layout == other.layout
        assert one.columns.keys() == other.columns.keys(), f"{what}: columns"
        for name, a in one.columns.items():
            b = other.columns[name]
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{what}: column {name}"
        assert one.lengths.keys() == other.lengths.keys(), f"{what}: lengths"
        for name, lengths in one.lengths.items():
            assert torch.equal(lengths, other.lengths[name]), f"{what}: lengths of {name}"
        assert (one.lease is None) == (other.lease is None), f"{what}: lease"
        if one.lease is not None:
            assert (one.lease.consumer, one.lease.seconds, one.lease.key) == (
                other.lease.consumer, other.lease.seconds, other.lease.key,
            ), f"{what}: lease"  # fmt: skip
    elif isinstance(one, torch.Tensor):
        assert isinstance(other, torch.Tensor) and one.dtype == other.dtype, what
        assert torch.equal(one, other), f"{what}: {one.tolist()} != {other.tolist()}"
    else:
        assert one == other, f"{what}: {one!r} != {other!r}"


class InspectedDockActor(DockActor):
    """A DockActor that also hands its dock's state_dict out: for tests only (the real one never does)."""

    def state(self) -> dict[str, Any]:
        return self._dock.state_dict()


def launch_ray(dock_cls: type[ExperienceDock], **kwargs: Any) -> Any:
    """An actor whose dock can be inspected (`ray_state`); `ray_client` makes its client once it runs."""
    actor_cls = ray.remote(num_cpus=0, concurrency_groups={"put": 4, "get": 16})(InspectedDockActor)
    return actor_cls.remote(dock_cls, kwargs)


def ray_client(actor: Any) -> RayDockClient:
    """The client of a `launch_ray` actor, built from the bare handle (it asks the actor's settings)."""
    return RayDockClient(actor, node=node_name(ray.get(actor.node_id.remote())))  # it runs: settings next


def ray_state(client: RayDockClient) -> dict[str, Any]:
    return ray.get(client.actor.state.remote())


def comparable_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {
        key: value for key, value in metrics.items()
        if key not in UNCOMPARED_METRICS and not key.startswith("dock/wait_s/")
    }  # fmt: skip


def full_state(dock: Any) -> Any:
    """Everything observable about one of a trio's docks (to check a failed call changed nothing)."""
    if isinstance(dock, ShardedDockClient):
        ledger, kinds = dock._router.call("state")
        statuses = {key: ledger[key] for key in (*STATUSES, "generators", "policy_version")}
        return statuses, kinds, comparable_metrics(dock.metrics())
    state = ray_state(dock) if isinstance(dock, RayDockClient) else dock.state_dict()
    return _no_wait(state), comparable_metrics(dock.metrics())


def assert_unchanged(before: Any, after: Any, what: str) -> None:
    if len(before) == 3:  # sharded: statuses, kinds, metrics
        for key, value in before[0].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, after[0][key]), f"{what}: {key}"
            elif key == "generators":
                assert all(torch.equal(x, y) for x, y in zip(value, after[0][key], strict=True)), what
            else:
                assert value == after[0][key], f"{what}: {key}"
        assert before[1] == after[1], f"{what}: column kinds"
    else:
        assert_same_state(before[0], after[0])
    assert before[-1] == after[-1], f"{what}: metrics"


class Trio:
    """A one-process dock, a Ray dock and a sharded dock built alike, driven by the same calls."""

    def __init__(self, one: ExperienceDock, ray_dock: RayDockClient, sharded: ShardedDockClient) -> None:
        self.one = one
        self.ray = ray_dock
        self.sharded = sharded

    @property
    def docks(self) -> tuple[Any, ...]:
        return self.one, self.ray, self.sharded

    def outcomes(self, method: str, *args: Any, **kwargs: Any) -> list[tuple[Any, BaseException | None]]:
        """(result, error) of `method` on each dock (an `Each` argument gives each dock its own value)."""
        out: list[tuple[Any, BaseException | None]] = []
        for i, dock in enumerate(self.docks):
            mine = [arg[i] if isinstance(arg, Each) else arg for arg in args]
            named = {key: arg[i] if isinstance(arg, Each) else arg for key, arg in kwargs.items()}
            try:
                out.append((getattr(dock, method)(*mine, **named), None))
            except Exception as error:
                out.append((None, error))
        return out

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Each:
        """Run `method` on every dock; assert equal results (or errors) and equal state after.

        Returns every result (an `Each`); re-raises the error every dock raised.
        """
        outcomes = self.outcomes(method, *args, **kwargs)
        what = f"{method}{args}"
        (one, one_error), *others = outcomes
        for name, (result, error) in zip(DOCKS[1:], others, strict=True):
            if one_error is not None or error is not None:
                assert type(one_error) is type(error), (
                    f"{what}: one dock raised {one_error!r}, {name} {error!r}"
                )
                assert message(one_error) == message(error), what
            else:
                same_result(one, result, f"{what} ({name})")
        self.check_state(what)
        if one_error is not None:
            raise one_error
        return Each(result for result, _ in outcomes)

    def check_state(self, what: str = "") -> None:
        """The Ray dock's state_dict equals one dock's; every status bitmap, the learned column kinds
        and the metrics of the sharded dock too."""
        one = _no_wait(self.one.state_dict())
        assert_same_state(one, _no_wait(ray_state(self.ray)))
        ledger, kinds = self.sharded._router.call("state")
        for key in STATUSES:
            assert torch.equal(one[key], ledger[key]), f"after {what}: {key}"
        assert one["policy_version"] == ledger["policy_version"], f"after {what}: policy_version"
        for a, b in zip(one["generators"], ledger["generators"], strict=True):
            assert torch.equal(a, b), f"after {what}: random sampler state"
        learned = {name: store.dtype for name, store in self.one._table.stores.items() if store is not None}
        assert learned == {name: dtype for name, (dtype, _) in kinds.items()}, f"after {what}: column dtypes"
        metrics = [comparable_metrics(dock.metrics()) for dock in self.docks]
        assert metrics[0] == metrics[1] == metrics[2], f"after {what}: metrics"


def _no_wait(state: dict[str, Any]) -> dict[str, Any]:
    state.pop("wait_s")
    return state


def launch_trio(dock_cls: type[ExperienceDock], shards: int, **kwargs: Any) -> Iterator[Trio]:
    """A `Trio` for a module-scoped fixture: its actors stop when the module is done."""
    actor = launch_ray(dock_cls, **kwargs)  # it starts while the sharded dock's actors start
    sharded = ShardedDockClient.launch(dock_cls, shards=shards, num_cpus=0, **kwargs)
    ray_dock = ray_client(actor)
    yield Trio(dock_cls(**kwargs), ray_dock, sharded)
    sharded.close()
    ray.kill(ray_dock.actor)


def run_catalogue(trio: Trio, leases: Leases) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Every case of the bad-input catalogue on every dock of `trio` (prepared: `leases` are `Each`es).

    Returns, per dock, the cases tried, those that raised their typed error and those that left the
    dock as it was; and every problem found (a wrong error, messages that differ, a changed dock).
    """
    per_dock = [Leases(live, settled) for live, settled in zip(leases.live, leases.settled, strict=True)]
    tally = {name: {"tried": 0, "typed error": 0, "unchanged": 0} for name in DOCKS}
    problems: list[str] = []
    before = [full_state(dock) for dock in trio.docks]  # every case must leave each dock so
    for case in CATALOGUE:
        calls = [case.call_for(dock_leases) for dock_leases in per_dock]
        args = [Each(call[0][i] for call in calls) for i in range(len(case.args))]
        kwargs = {key: Each(call[1][key] for call in calls) for key in case.kwargs}
        outcomes = trio.outcomes(case.method, *args, **kwargs)
        messages = {message(error) for _, error in outcomes if error is not None}
        if len(messages) > 1:
            problems.append(f"{case.name}: the messages differ: {sorted(messages)}")
        for i, (name, dock, (_, error)) in enumerate(zip(DOCKS, trio.docks, outcomes, strict=True)):
            tally[name]["tried"] += 1
            problem = check_outcome(case, error)
            if problem is None:
                tally[name]["typed error"] += 1
            else:
                problems.append(f"{case.method} {case.name} on {name}: {problem}")
            after = full_state(dock)
            try:
                assert_unchanged(before[i], after, f"{case.method} {case.name} on {name}")
                tally[name]["unchanged"] += 1
            except AssertionError as changed:
                problems.append(f"{changed!r}")
                before[i] = after  # judge the next case from where this one left the dock
    return tally, problems
