"""The Ray worker group: one actor per rank, one placement-group bundle per rank.

Workers take their environment (thread settings) from the Ray job: `entrepot.grpo.ray_start`.

Ray stays here (and in `entrepot.dock.ray`): the rest of the trainer sees `WorkerGroup` and `wait_all`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from entrepot.grpo.errors import GRPOError, StageError
from entrepot.grpo.workers.group import Pending, RankInfo

__all__ = ["RayWorkerGroup", "is_ref", "wait_refs"]

W = TypeVar("W")
R = TypeVar("R")
P = ParamSpec("P")

_PLACEMENT_TIMEOUT_S = 120.0


class RayWorkerGroup(Generic[W]):
    """Workers of class `cls` as Ray actors, rank i in bundle i of one placement group.

    Args:
        name: the role (``actor``, ``reward``), used in errors.
        cls: the worker class (a plain class; it is wrapped with ``ray.remote`` here).
        ranks: one worker per rank.
        args: the constructor arguments of one rank's worker.
        num_cpus: Ray CPUs per rank (fractional shares co-locate on a small machine).
        num_gpus: Ray GPUs per rank (Ray then sets CUDA_VISIBLE_DEVICES to the rank's GPU).
    """

    def __init__(
        self,
        name: str,
        cls: type[W],
        ranks: Sequence[RankInfo],
        args: Callable[[RankInfo], tuple[Any, ...]],
        *,
        num_cpus: float,
        num_gpus: float = 0,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name = name
        self.ranks = list(ranks)
        bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self._group = placement_group([bundle] * len(self.ranks), strategy="PACK")
        try:
            ray.get(self._group.ready(), timeout=_PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise GRPOError(
                f"Ray could not place {len(self.ranks)} {name} workers of {bundle} each within "
                f"{_PLACEMENT_TIMEOUT_S:.0f} s; the cluster has {ray.available_resources()} free "
                "(lower resources.num_cpus_per_worker or the worker count)"
            ) from None
        remote = ray.remote(_keep_start_error(cls))
        self.actors = [
            remote.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._group, placement_group_bundle_index=rank.rank
                ),
            ).remote(*args(rank))
            for rank in self.ranks
        ]

    def call(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> Pending[R]:
        refs = [getattr(actor, method.__name__).remote(*args, **kwargs) for actor in self.actors]
        names = [f"{self.name} {rank.name}" for rank in self.ranks]
        return Pending(f"{self.name}.{method.__name__}", refs, names)

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
        remove_placement_group(self._group)


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


def is_ref(handle: Any) -> bool:
    """Whether `handle` is a Ray future (False without importing Ray when Ray was never loaded)."""
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(handle, ray.ObjectRef)


def wait_refs(pendings: Sequence[Pending[Any]], timeout: float) -> list[list[Any]]:
    """`wait_all` for Ray futures: wait on all together, raise on the first failure or at the timeout."""
    import ray

    where: dict[Any, tuple[int, int]] = {}
    results: list[list[Any]] = [list(p.handles) for p in pendings]
    for i, pending in enumerate(pendings):
        for j, handle in enumerate(pending.handles):
            if is_ref(handle):
                where[handle] = (i, j)
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


def _result(ref: Any, pending: Pending[Any], rank: int) -> Any:
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
