"""The dock as a Ray actor, behind the same DockClient API (needs `pip install entrepot-dock[ray]`).

    client = RayDockClient.launch(GRPODock, prompts_num=256, n_samples_per_prompt=8)
    rows = client.put_prompts(prompts)
    batch = client.get("actor_rollout", ["prompts"], 64)

The actor is threaded: gets (which may block) run in a "get" concurrency group of `max_concurrency`
threads, puts and control calls in their own small group, so blocked getters never starve a put.
It asks for a fraction of a CPU. Data crosses Ray as one uint8 numpy buffer per call (see _wire):
Ray stores it in the object store once and the receiver maps it without copying; nothing is
pickled per row or per column. The client handle is picklable: pass it to other actors.

Anyone who can reach the Ray cluster can call the actor, so it runs only what a client needs: the
methods in `CALLABLE_METHODS` (a private method or an unknown name is refused), and `save` / `load`
only under the `files_root` it was launched with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

try:
    import ray
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("entrepot.dock.ray needs Ray: pip install 'entrepot-dock[ray]'") from error

from entrepot.dock._batch import LAYOUTS, Batch, Layout, build_batch
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockStateError, InvalidArgumentError
from entrepot.dock._grpo import count_prompts
from entrepot.dock._inputs import normalize_column, normalize_put
from entrepot.dock._leases import Lease
from entrepot.dock._wire import WireLayout, as_uint8, decode, encode_columns, encode_taken

__all__ = ["CALLABLE_METHODS", "DockActor", "RayDockClient"]

CALLABLE_METHODS = frozenset(
    {
        "put_prompts", "peek", "ack", "release", "all_consumed", "progress", "clear", "reset", "metrics",
        "save", "load", "set_policy_version", "finished_rows",
    }
)  # fmt: skip
"""The dock methods a client may run through `DockActor.call` (puts and gets have their own calls)."""


class DockActor:
    """Holds one ExperienceDock (or subclass) and serves wire-format puts and gets.

    A plain class: `RayDockClient.launch` makes it a Ray actor with its concurrency groups
    (Ray takes concurrency groups only at decoration time, not in `.options()`).
    """

    def __init__(
        self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any], num_threads: int = 1,
        files_root: str | None = None,
    ) -> None:  # fmt: skip
        torch.set_num_threads(num_threads)
        self._dock = dock_cls(**dock_kwargs)
        self._files_root = None if files_root is None else Path(files_root).resolve()

    @ray.method(concurrency_group="put")
    def put_wire(
        self, layout: WireLayout, buffer: Any, indexes: torch.Tensor, completed: Any, ack: Lease | None = None
    ) -> None:
        _, raw, _ = decode(layout, as_uint8(buffer))
        data = {name: flat if lengths is None else (flat, lengths) for name, (flat, lengths) in raw.items()}
        self._dock.put(data, indexes, completed=completed, ack=ack)

    @ray.method(concurrency_group="get")
    def get_wire(self, consumer: str, columns: list[str], count: int, kwargs: dict[str, Any]) -> Any:
        taken = self._dock._take(consumer, columns, count, **kwargs)
        if taken is None:
            return None
        try:
            layout, buffer = encode_taken(taken)
        except BaseException:
            self._dock._untake(consumer, taken)
            raise
        finally:
            self._dock._done_reading()
        return layout, buffer.numpy(), taken.lease

    @ray.method(concurrency_group="put")
    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one of `CALLABLE_METHODS` on the dock; anything else is an `InvalidArgumentError`."""
        if method not in CALLABLE_METHODS:
            raise InvalidArgumentError(
                f"dock method {method!r} cannot be called through the Ray actor; allowed: "
                + ", ".join(sorted(CALLABLE_METHODS))
            )
        if method in ("save", "load"):
            args, kwargs = (self._confined(method, args[0] if args else kwargs.get("path")),), {}
        return getattr(self._dock, method)(*args, **kwargs)

    def _confined(self, method: str, path: Any) -> str:
        """`path` resolved inside `files_root` (symlinks and '..' followed first), else an error."""
        if self._files_root is None:
            raise InvalidArgumentError(
                f"dock {method} through Ray needs the actor launched with files_root= (the only "
                "directory it may write or read)"
            )
        target = (self._files_root / str(path)).resolve()
        if not target.is_relative_to(self._files_root):
            raise InvalidArgumentError(
                f"dock {method} path {str(path)!r} resolves to {str(target)!r}, outside the dock's "
                f"files_root {str(self._files_root)!r}"
            )
        return str(target)


class RayDockClient:
    """DockClient for a dock living in a `DockActor`; same arguments and results as ExperienceDock."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    @classmethod
    def launch(
        cls,
        dock_cls: type[ExperienceDock] = ExperienceDock,
        *,
        num_cpus: float = 0.25,
        max_concurrency: int = 16,
        name: str | None = None,
        files_root: str | None = None,
        **dock_kwargs: Any,
    ) -> RayDockClient:
        """Start a DockActor holding `dock_cls(**dock_kwargs)` and return a client for it.

        Args:
            dock_cls: ExperienceDock or a subclass such as GRPODock.
            num_cpus: the actor's CPU request (it mostly waits and copies memory).
            max_concurrency: threads serving gets (each blocked get holds one).
            name: optional Ray actor name, so other processes can `ray.get_actor` it.
            files_root: the one directory `save` / `load` may use (paths resolve inside it; relative
                ones are taken from it); None refuses both.
            dock_kwargs: the dock's constructor arguments.
        """
        actor_cls = ray.remote(num_cpus=num_cpus, concurrency_groups={"put": 4, "get": max_concurrency})(
            DockActor
        )
        options = {} if name is None else {"name": name}
        return cls(actor_cls.options(**options).remote(dock_cls, dock_kwargs, files_root=files_root))

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return ray.get(self.actor.call.remote(method, args, kwargs))

    def put(
        self,
        data: Mapping[str, Any],
        indexes: Sequence[int] | torch.Tensor,
        *,
        lengths: Mapping[str, Any] | None = None,
        completed: Sequence[bool] | torch.Tensor | None = None,
        ack: Lease | None = None,
    ) -> None:
        """As ExperienceDock.put; the data is unpadded here and shipped as one buffer."""
        rows = torch.as_tensor(indexes).reshape(-1)
        data = dict(data.items())  # a TensorDict iterates over rows, not keys
        columns = normalize_put(data, lengths, rows.numel(), {})
        layout, buffer = encode_columns(columns)  # the caller's rows are copied once, into the wire buffer
        done = None if completed is None else torch.as_tensor(completed, dtype=torch.bool)
        ray.get(self.actor.put_wire.remote(layout, buffer.numpy(), rows, done, ack))

    def get(
        self,
        consumer: str,
        columns: Sequence[str],
        count: int,
        *,
        indexes: Sequence[int] | torch.Tensor | None = None,
        min_count: int | None = None,
        timeout: float | None = None,
        groups: bool | None = None,
        sampler: Any = "fifo",
        num_ranks: int = 1,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
        lease: float | None = None,
        lease_key: str | None = None,
    ) -> Batch | None:
        """As ExperienceDock.get; the rows arrive as one zero-copy buffer and are laid out here.

        A lease's clock runs in the actor: a reply lost on its way here (this process died) is
        handed out again when the lease expires.
        """
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        kwargs = {
            "indexes": None if indexes is None else torch.as_tensor(indexes),
            "min_count": min_count,
            "timeout": timeout,
            "groups": groups,
            "sampler": sampler,
            "num_ranks": num_ranks,
            "lease": lease,
            "lease_key": lease_key,
        }
        reply = ray.get(self.actor.get_wire.remote(consumer, list(columns), count, kwargs))
        if reply is None:
            return None
        wire_layout, array, granted = reply
        rows, raw, ages = decode(wire_layout, as_uint8(array))
        # The received buffer is read-only shared memory: the batch holds copies (scalars cloned
        # too). The padded layout copies each row itself, straight out of the buffer.
        copied: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for name, (flat, lengths) in raw.items():
            if lengths is None:
                copied[name] = (flat.clone(), None)
            else:
                copied[name] = (flat if layout == "padded" else flat.clone(), lengths.clone())
        batch = build_batch(rows.clone(), copied, ages.clone(), layout, pad_value, pad_multiple)
        return batch if granted is None else replace(batch, lease=granted)

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.ack in the actor."""
        self._call("ack", lease, None if indexes is None else torch.as_tensor(indexes))

    def release(self, lease: Lease) -> int:
        """ExperienceDock.release in the actor."""
        return int(self._call("release", lease))

    def put_prompts(
        self, prompts: Any, n_samples_per_prompt: int | None = None, *, lengths: Any = None, **kwargs: Any
    ) -> torch.Tensor:
        """GRPODock.put_prompts in the actor; the prompts travel packed (two tensors, not one per prompt)."""
        column = normalize_column("prompts", prompts, lengths, count_prompts(prompts, lengths), False)
        assert column.lengths is not None  # sequences
        packed = (column.flat, column.lengths)
        result: torch.Tensor = self._call("put_prompts", packed, n_samples_per_prompt, **kwargs)
        return result

    def peek(self, columns: Sequence[str], indexes: Sequence[int] | torch.Tensor, **kwargs: Any) -> Batch:
        result: Batch = self._call("peek", list(columns), torch.as_tensor(indexes), **kwargs)
        return result

    def all_consumed(self, consumer: str) -> bool:
        return bool(self._call("all_consumed", consumer))

    def progress(self, consumer: str) -> dict[str, int]:
        result: dict[str, int] = self._call("progress", consumer)
        return result

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        self._call("clear", indexes)

    def reset(self) -> None:
        self._call("reset")

    def set_policy_version(self, version: int) -> int:
        """ExperienceDock.set_policy_version in the actor."""
        return int(self._call("set_policy_version", version))

    def finished_rows(self) -> torch.Tensor:
        """ExperienceDock.finished_rows in the actor."""
        result: torch.Tensor = self._call("finished_rows")
        return result

    def metrics(self) -> dict[str, float]:
        result: dict[str, float] = self._call("metrics")
        return result

    def save(self, path: str) -> None:
        """Save the actor's dock to `path`, on the actor's node, inside its `files_root`."""
        self._call("save", path)

    def load(self, path: str) -> None:
        """Load the actor's dock from `path`, on the actor's node, inside its `files_root`.

        A file that fails its checks raises the actor's `DockStateError` itself, message and all
        (Ray's wrapper would put the actor's traceback in front of the one line that matters).
        """
        try:
            self._call("load", path)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, DockStateError):
                raise error.cause from None
            raise
