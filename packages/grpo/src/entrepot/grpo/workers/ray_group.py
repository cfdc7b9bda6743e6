"""The Ray worker group: one actor per rank, in the bundles of a `Placement` (see `placement` for the layout).

Workers take their environment (thread settings) from the Ray job: `entrepot.grpo.run.ray_start`.

Ray stays here, in `placement` (and in `entrepot.dock.ray`): the rest of the trainer sees
`WorkerGroup` and `wait_all`. Errors the driver raises about a rank (it died, it timed out) name
the rank's node, so a lost node of a cluster is named in the run's error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

from entrepot.grpo.errors import GRPOError, StageError
from entrepot.grpo.workers.group import Pending
from entrepot.grpo.workers.placement import Placement
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["RayPending", "RayWorkerGroup", "wait_refs"]

W = TypeVar("W")
R = TypeVar("R")
P = ParamSpec("P")


class RayWorkerGroup(Generic[W]):
    """Workers of class `cls` as Ray actors, one per rank of `placement`, each in its rank's bundle.

    Args:
        cls: the worker class (a plain class; it is wrapped with ``ray.remote`` here).
        placement: the role (its name, used in errors), the ranks, their resources (CPUs, GPUs,
            custom) and the reserved bundles; the group removes it on `close`.
        args: the constructor arguments of one rank's worker.
        concurrency: calls a worker serves at once, on threads of its own (1: one after another).
    """

    def __init__(
        self, cls: type[W], placement: Placement, args: Callable[[RankInfo], tuple[Any, ...]],
        *, concurrency: int = 1,
    ) -> None:  # fmt: skip
        import ray

        self.name = name = placement.name
        self.placement = placement
        self.ranks = list(placement.ranks)
        remote = ray.remote(_keep_start_error(cls))
        threads = {"max_concurrency": concurrency} if concurrency > 1 else {}
        self.actors = [
            remote.options(**placement.actor_options(rank), **threads).remote(*args(rank))
            for rank in self.ranks
        ]
        # driver-side errors about a rank (it died, it timed out) name its node
        self._names = [
            f"{name} {rank.name} on {node}" for rank, node in zip(self.ranks, placement.nodes, strict=True)
        ]

    def call(
        self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> RayPending[R]:
        refs = [getattr(actor, method.__name__).remote(*args, **kwargs) for actor in self.actors]
        return RayPending(f"{self.name}.{method.__name__}", refs, list(self._names))

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
        self.placement.remove()


def _keep_start_error(cls: type[W]) -> type[W]:
    """`cls` whose constructor error is kept and raised by `ready()` rather than killing the actor.

    Ray reports an actor whose ``__init__`` raised as a dead actor with the error flattened into
    text; raised from a method call, the worker's own exception (a `DataError` naming the key)
    reaches the driver intact. The trainer calls ``ready`` on every worker before anything else.
    """

    class StartErrorKept(cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._start_error: Exception | None = None
            try:
                super().__init__(*args, **kwargs)
            except Exception as exc:
                self._start_error = exc

        def ready(self) -> Any:
            if self._start_error is not None:
                raise self._start_error
            return super().ready()

    StartErrorKept.__name__ = StartErrorKept.__qualname__ = cls.__name__
    return StartErrorKept


class RayPending(Pending[R]):
    """A call on every rank of a `RayWorkerGroup`: one Ray future per rank."""

    def __init__(self, label: str, refs: list[Any], workers: list[str]) -> None:
        super().__init__(label, workers)
        self.refs = refs

    @classmethod
    def wait_together(cls, pendings: Sequence[Self], timeout: float) -> list[list[Any]]:
        return wait_refs(pendings, timeout)


def wait_refs(pendings: Sequence[RayPending[Any]], timeout: float) -> list[list[Any]]:
    """`wait_all` for Ray futures: wait on all together, raise on the first failure or at the timeout."""
    import ray

    where: dict[Any, tuple[int, int]] = {}
    results: list[list[Any]] = [list(p.refs) for p in pendings]  # each replaced by its result
    for i, pending in enumerate(pendings):
        for j, ref in enumerate(pending.refs):
            where[ref] = (i, j)
    remaining = list(where)
    deadline = time.monotonic() + timeout
    while remaining:
        left = deadline - time.monotonic()
        ready, remaining = ray.wait(remaining, num_returns=1, timeout=max(left, 0.0))
        if not ready:
            i, j = where[remaining[0]]
            raise StageError(
                pendings[i].label, pendings[i].workers[j], None,
                f"no result within resources.stage_timeout_s ({timeout:g} s)",
            )  # fmt: skip
        for ref in ready:
            i, j = where[ref]
            results[i][j] = _result(ref, pendings[i], j)
    return results


def _result(ref: Any, pending: RayPending[Any], rank: int) -> Any:
    """ray.get of one finished call; a worker's own error comes back as itself (StageError, user errors)."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, GRPOError):
            raise cause from None
        raise StageError(
            pending.label, pending.workers[rank], None, f"{type(cause).__name__}: {cause}"
        ) from None
    except ray.exceptions.RayActorError as exc:
        raise StageError(
            pending.label, pending.workers[rank], None, f"the worker process died: {exc}"
        ) from None
