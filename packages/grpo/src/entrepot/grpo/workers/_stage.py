"""What every stage method of a worker shares: error reporting and reading its rows from the dock."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo.errors import GRPOError, StageError
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["SEQUENCE_COLUMNS", "DockReader", "stage"]

SEQUENCE_COLUMNS = ["prompts", "responses", "response_length"]
"""The packed prompt + response columns every forward pass over whole sequences reads."""

P = ParamSpec("P")
R = TypeVar("R")


class _Staged(Protocol):
    role: str
    rank: RankInfo
    reader: DockReader


S = TypeVar("S", bound=_Staged)


def stage(name: str) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Turn any failure of a stage method into `StageError` naming the stage, the worker and its rows.

    Errors of entrepot.grpo itself (a bad config, a missing file, a failed stage) pass unchanged so
    that the user sees their own message.
    """

    def wrap(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def run(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            self.reader.rows = None
            try:
                return method(self, *args, **kwargs)
            except GRPOError:
                raise
            except Exception as exc:
                worker = f"{self.role} {self.rank.name}"
                reason, details = f"{type(exc).__name__}: {exc}", traceback.format_exc()
                raise StageError(name, worker, self.reader.rows, reason, details) from exc

        return run

    return wrap


class DockReader:
    """A worker's reads from the dock: packed layout, a timeout on every wait, rows remembered for errors.

    Ranks of one model-parallel group (TP x PP > 1) read each batch once: the group's first rank gets
    it from the dock and `entrepot.dock.dispatch_get` broadcasts it to the others (`group` is then
    that process group). With TP = PP = 1 every rank reads for itself.

    Args:
        rank: the worker's coordinates.
        timeout: seconds a get may wait for ready rows before `DockTimeout`.
        group: the model-parallel process group, when TP x PP > 1.
    """

    def __init__(self, rank: RankInfo, timeout: float, group: Any = None) -> None:
        self.rank, self.timeout, self.group = rank, timeout, group
        self.rows: list[int] | None = None  # the rows of the stage in progress, for StageError

    def get(
        self, dock: DockClient, consumer: str, columns: Sequence[str], count: int, *, alone: bool = False,
        **kwargs: Any,
    ) -> Batch | None:  # fmt: skip
        """One packed batch of up to `count` rows (None when the consumer has read every row).

        `alone` reads for this rank only, also inside a model-parallel group (the rollout, whose
        engine holds the whole model on every rank, unless a tensor-parallel vLLM spans the group).
        """
        if alone or self.group is None or self.rank.model_parallel_size == 1:
            batch = dock.get(consumer, list(columns), count, layout="packed", timeout=self.timeout, **kwargs)
        else:
            from entrepot.dock import dispatch_get

            batch = dispatch_get(
                dock if self.rank.reads_dock else None, consumer, columns, count,
                group=self.group, src=self.rank.group_source, layout="packed", timeout=self.timeout, **kwargs,
            )  # fmt: skip
        if batch is not None:
            self.rows = (self.rows or []) + batch.indexes.tolist()
        return batch

    def batches(
        self, dock: DockClient, consumer: str, columns: Sequence[str], count: int, min_count: int,
        *, alone: bool = False,
    ) -> Iterator[Batch]:  # fmt: skip
        """Batches of up to `count` rows (at least `min_count`, whole groups) until the consumer has read all.

        Ranks that read the same stage share its rows: whoever asks first takes the next ones.
        """
        while (
            batch := self.get(dock, consumer, columns, count, min_count=min_count, alone=alone)
        ) is not None:
            yield batch

    def stage_batches(
        self, dock: DockClient, consumer: str, columns: Sequence[str], count: int, min_count: int,
        rows: Sequence[int] | None = None,
    ) -> Iterable[Batch]:  # fmt: skip
        """A log-prob stage's batches: shared rows (`batches`), or, given the step's `rows`, this DP
        replica's chunks of `count` of them (the step sizes `count` so each replica gets one share)."""
        if rows is None:
            return self.batches(dock, consumer, columns, count, min_count=min_count)
        chunks = [rows[i : i + count] for i in range(0, len(rows), count)]
        mine = chunks[self.rank.dp_rank :: self.rank.dp_size]
        return (self.take(dock, consumer, columns, chunk) for chunk in mine)

    def take(self, dock: DockClient, consumer: str, columns: Sequence[str], rows: Sequence[int]) -> Batch:
        """Exactly `rows` (a plan made by the driver), in that order."""
        batch = self.get(dock, consumer, columns, len(rows), indexes=torch.as_tensor(rows, dtype=torch.int64))
        if batch is None:
            raise RuntimeError(f"the dock has already handed rows {list(rows)[:8]} to {consumer!r}")
        return batch
