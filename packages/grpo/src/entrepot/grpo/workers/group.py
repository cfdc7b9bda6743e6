"""Worker groups: the ranks that run a stage, in this process or as Ray actors, behind one interface.

The trainer holds one group per role (actor, reward) and calls typed methods on it:

    pending = actors.call(ActorWorker.rollout, dock, count)   # every rank, same arguments
    stats = wait_all([pending], timeout)[0]                      # one result per rank

`call` takes the worker class's method itself (never its name as a string), so a type checker sees
the arguments and the result. A rank knows its data / tensor / pipeline coordinates (`RankInfo`);
a method that needs rank-specific input receives the plan for every rank and picks its own.

Two implementations, as the dock has two clients: `LocalWorkerGroup` (workers are objects in this
process, calls run at once: its `Pending`s are `DonePending`) and
`entrepot.grpo.workers.ray_group.RayWorkerGroup` (one Ray actor per rank, placed by
`entrepot.grpo.workers.placement`: a node per DP replica; its `Pending`s hold futures). `wait_all`
waits on calls of several groups together and fails fast: the first failure raises `StageError`
naming the stage, the worker and its rows, while the other calls may still be running.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar

from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["DonePending", "LocalWorkerGroup", "Pending", "WorkerGroup", "wait_all"]

W = TypeVar("W")
W_co = TypeVar("W_co", covariant=True)
R = TypeVar("R")
P = ParamSpec("P")


class Pending(ABC, Generic[R]):
    """One call on every rank of a group, maybe still running; `wait_all` collects the results.

    The group that made it chooses how it is waited on: its subclass's `wait_together`, which
    `wait_all` calls once with every pending of that subclass, so calls of several groups are
    waited on together.

    Attributes:
        label: ``"<group>.<method>"``, used in errors.
        workers: per rank, the worker's name for errors (``actor rank 1``).
    """

    def __init__(self, label: str, workers: list[str]) -> None:
        self.label, self.workers = label, workers

    @classmethod
    @abstractmethod
    def wait_together(cls, pendings: Sequence[Self], timeout: float) -> list[list[Any]]:
        """Results of `pendings`, per call per rank; the first failure or the timeout raises `StageError`."""


class DonePending(Pending[R]):
    """A call that already ran (in this process): its results, one per rank."""

    def __init__(self, label: str, results: list[R], workers: list[str]) -> None:
        super().__init__(label, workers)
        self.results = results

    @classmethod
    def wait_together(cls, pendings: Sequence[Self], timeout: float) -> list[list[Any]]:
        return [list(p.results) for p in pendings]


class WorkerGroup(Protocol[W_co]):
    """Ranks running one role's workers. `call` starts a method of the worker class on every rank."""

    name: str
    ranks: list[RankInfo]

    def call(
        self, method: Callable[Concatenate[W_co, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> Pending[R]: ...

    def close(self) -> None: ...


class LocalWorkerGroup(Generic[W]):
    """Workers built in this process; a call runs on every rank in turn before `call` returns.

    Args:
        name: the role (``actor``, ``reward``), used in errors.
        build: makes the worker of one rank.
        ranks: the ranks (one per worker).
    """

    def __init__(self, name: str, build: Callable[[RankInfo], W], ranks: Sequence[RankInfo]) -> None:
        self.name = name
        self.ranks = list(ranks)
        self.workers = [build(rank) for rank in self.ranks]

    def call(
        self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> DonePending[R]:
        results = [method(worker, *args, **kwargs) for worker in self.workers]
        names = [f"{self.name} {rank.name}" for rank in self.ranks]
        return DonePending(f"{self.name}.{method.__name__}", results, names)

    def close(self) -> None:
        self.workers.clear()


def wait_all(pendings: Sequence[Pending[Any]], timeout: float) -> list[list[Any]]:
    """Results of every call, per call per rank; the first failure (or the timeout) raises `StageError`.

    Calls that ran in this process are already done; Ray calls are waited on together, so a stage
    that fails while another one is still waiting in the dock fails the step at once.
    """
    by_kind: dict[type[Pending[Any]], list[int]] = {}
    for i, pending in enumerate(pendings):
        by_kind.setdefault(type(pending), []).append(i)
    results: list[list[Any]] = [[] for _ in pendings]
    for kind, indexes in by_kind.items():
        waited = kind.wait_together([pendings[i] for i in indexes], timeout)
        for i, per_rank in zip(indexes, waited, strict=True):
            results[i] = per_rank
    return results
