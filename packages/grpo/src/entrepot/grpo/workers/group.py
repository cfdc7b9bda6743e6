"""Worker groups: the ranks that run a stage, in this process or as Ray actors, behind one interface.

The trainer holds one group per role (actor, reward) and calls typed methods on it:

    pending = actors.call(ActorWorker.rollout, dock, count)   # every rank, same arguments
    stats = wait_all([pending], timeout)[0]                      # one result per rank

`call` takes the worker class's method itself (never its name as a string), so a type checker sees
the arguments and the result. A rank knows its data / tensor / pipeline coordinates (`RankInfo`);
a method that needs rank-specific input receives the plan for every rank and picks its own.

Two implementations, as the dock has two clients: `LocalWorkerGroup` (workers are objects in this
process, calls run at once) and `entrepot.grpo.workers.ray_group.RayWorkerGroup` (one Ray actor per
rank, placed by `entrepot.grpo.workers.placement`: a node per DP replica; calls return futures).
`wait_all` waits on calls of several groups together and fails fast: the first failure raises
`StageError` naming the stage, the worker and its rows, while the other calls may still be running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

__all__ = ["LocalWorkerGroup", "Pending", "RankInfo", "WorkerGroup", "rank_layout", "wait_all"]

W = TypeVar("W")
W_co = TypeVar("W_co", covariant=True)
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True)
class RankInfo:
    """Where a worker sits: its global rank and its data / tensor / pipeline parallel coordinates.

    Ranks are numbered as megatron-core numbers them (and `entrepot.resharding.ParallelLayout`):
    TP fastest, then DP, then PP; the ranks of one model-parallel group share a DP rank.
    """

    rank: int
    world_size: int
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one model replica (TP x PP); they read each batch once, through rank 0 of it."""
        return self.tp_size * self.pp_size

    @property
    def reads_dock(self) -> bool:
        """Whether this rank talks to the dock (first rank of its model-parallel group)."""
        return self.tp_rank == 0 and self.pp_rank == 0

    @property
    def group_source(self) -> int:
        """Global rank of this rank's model-parallel group leader (TP rank 0 of PP stage 0)."""
        return self.dp_rank * self.tp_size

    @property
    def name(self) -> str:
        if self.model_parallel_size == 1:
            return f"rank {self.rank}"
        return f"rank {self.rank} (dp {self.dp_rank}, tp {self.tp_rank}, pp {self.pp_rank})"


def rank_layout(dp_size: int, tp_size: int = 1, pp_size: int = 1) -> list[RankInfo]:
    """Every rank of a DP x TP x PP group, in megatron-core's order (TP fastest, PP slowest)."""
    from entrepot.resharding.layout import ParallelLayout

    world = dp_size * tp_size * pp_size
    layout = ParallelLayout(tp=tp_size, pp=pp_size)
    ranks = []
    for r in range(world):
        c = layout.coords(r, world)
        ranks.append(
            RankInfo(rank=r, world_size=world, dp_rank=c.dp_rank, dp_size=dp_size,
                     tp_rank=c.tp_rank, tp_size=tp_size, pp_rank=c.pp_rank, pp_size=pp_size)
        )  # fmt: skip
    return ranks


class Pending(Generic[R]):
    """One call on every rank of a group, maybe still running; `wait_all` collects the results.

    Attributes:
        label: ``"<group>.<method>"``, used in errors.
        handles: per rank, the result (in-process) or a Ray ObjectRef.
        workers: per rank, the worker's name for errors (``actor rank 1``).
    """

    def __init__(self, label: str, handles: list[Any], workers: list[str]) -> None:
        self.label, self.handles, self.workers = label, handles, workers


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

    def call(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        results = [method(worker, *args, **kwargs) for worker in self.workers]
        names = [f"{self.name} {rank.name}" for rank in self.ranks]
        return Pending(f"{self.name}.{method.__name__}", results, names)

    def close(self) -> None:
        self.workers.clear()


def wait_all(pendings: Sequence[Pending[Any]], timeout: float) -> list[list[Any]]:
    """Results of every call, per call per rank; the first failure (or the timeout) raises `StageError`.

    Calls that ran in this process are already done; Ray calls are waited on together, so a stage
    that fails while another one is still waiting in the dock fails the step at once.
    """
    from entrepot.grpo.workers import ray_group

    if any(ray_group.is_ref(h) for p in pendings for h in p.handles):
        return ray_group.wait_refs(pendings, timeout)
    return [list(p.handles) for p in pendings]
