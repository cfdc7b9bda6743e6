"""Checkpoints: safetensors for every tensor, JSON for the rest, no pickle of anything loaded back.

A checkpoint directory ``checkpoints/step_000050/`` holds:
- ``model.safetensors`` / ``reference.safetensors`` (``model.shard003.safetensors`` ... when the
  model is split over TP x PP ranks: one file per shard): this rank's parameters (HF names for the torch
  engine, its TP / PP shard under global training names for megatron; tied weights once);
- ``optimizer.safetensors``: AdamW moments and step counts, keyed ``<param index>.<key>``;
- ``rng.safetensors``: the torch global RNG, the sampler's generator state and, on a GPU, the device RNG;
- ``dock.pt``: the dock's state_dict (plain tensors, read back with ``weights_only=True``);
- ``state.json``: step, data position, scheduler state, optimizer param groups (per shard), the config.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.errors import CheckpointError

if TYPE_CHECKING:
    from entrepot.grpo.policy import Policy

__all__ = ["capture_state", "latest_checkpoint", "read_checkpoint", "restore_state", "write_checkpoint"]

_FILES = ("model", "reference", "optimizer", "rng")


def _copies(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().clone().contiguous() for name, p in named.items()}


def capture_state(worker: Policy) -> dict[str, Any]:
    """Everything a rank needs to continue exactly: tensors per file plus JSON-able values.

    Parameters are this rank's (the whole model for the torch engine; its TP / PP shard under
    global training names for megatron), so a run resumes with the layout it was saved with.
    """
    trainer = worker.trainer
    optim = trainer.torch_optimizer.state_dict()
    optim_tensors = {
        f"{index}.{key}": torch.as_tensor(value).cpu().clone()
        for index, state in optim["state"].items()
        for key, value in state.items()
    }
    scheduler = {k: v for k, v in trainer.scheduler.state_dict().items() if k != "lr_lambdas"}
    return {
        "model": _copies(trainer.named_parameters()),
        "reference": _copies(trainer.named_reference()),
        "optimizer": optim_tensors,
        "rng": _rng_states(worker),
        "json": {"param_groups": optim["param_groups"], "scheduler": scheduler},
    }


def _rng_states(worker: Policy) -> dict[str, torch.Tensor]:
    """The RNG streams a step draws from: torch's, the sampler's and, on a GPU, the device's."""
    states = {"torch": torch.get_rng_state(), "sampler": worker.generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def restore_state(worker: Policy, state: Mapping[str, Any]) -> None:
    """Load a `capture_state` result into a freshly built policy of the same config."""
    trainer = worker.trainer
    with torch.no_grad():
        for named, key in ((trainer.named_parameters(), "model"), (trainer.named_reference(), "reference")):
            saved = state[key]
            for name, p in named.items():
                if name not in saved:
                    raise CheckpointError(f"checkpoint {key} has no parameter {name!r}")
                p.copy_(saved[name])
    trainer.after_restore()
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for flat, value in state["optimizer"].items():
        index, key = flat.split(".", 1)
        per_param.setdefault(int(index), {})[key] = value.clone()  # own storage (offload resizes it)
    groups = state["json"]["param_groups"]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    trainer.torch_optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    trainer.scheduler.load_state_dict({**trainer.scheduler.state_dict(), **state["json"]["scheduler"]})
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"]:  # HF generate samples from the device's RNG
        torch.cuda.set_rng_state(state["rng"]["cuda"])
    worker.generator.set_state(state["rng"]["sampler"])


def _shard_file(name: str, shard: int, num_shards: int) -> str:
    return f"{name}.safetensors" if num_shards == 1 else f"{name}.shard{shard:03d}.safetensors"


def write_checkpoint(
    directory: Path,
    rank_states: list[dict[str, Any]],
    meta: Mapping[str, Any],
    dock: Any = None,
    shards: list[int] | None = None,
) -> Path:
    """Write one checkpoint atomically via a temp dir: model/optimizer once per model shard, every RNG.

    Args:
        rank_states: `capture_state()` of every rank.
        shards: each rank's model-parallel shard index (TP x PP position); ranks of one shard are
            data-parallel replicas, so the first of them is written. Default: one shard.
    """
    from safetensors.torch import save_file

    shards = shards or [0] * len(rank_states)
    num_shards = len(set(shards))
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written: set[int] = set()
    for state, shard in zip(rank_states, shards, strict=True):
        if shard in written:
            continue
        written.add(shard)
        for name in ("model", "reference", "optimizer"):
            save_file(state[name], str(tmp / _shard_file(name, shard, num_shards)))
    rng = {f"rank{r}.{k}": v for r, s in enumerate(rank_states) for k, v in s["rng"].items()}
    save_file(rng, str(tmp / "rng.safetensors"))
    if dock is not None:
        dock(tmp / "dock.pt")
    # optimizer param groups differ between pipeline stages (each its own parameters): kept per shard
    groups: dict[str, Any] = {}
    for state, shard in zip(rank_states, shards, strict=True):
        groups.setdefault(str(shard), state["json"]["param_groups"])
    state_json = {**meta, **rank_states[0]["json"], "shard_param_groups": groups, "num_shards": num_shards}
    (tmp / "state.json").write_text(json.dumps(state_json, indent=1))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def read_checkpoint(directory: Path, rank: int, shard: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state for `restore_state` of `rank`, whose model shard is `shard`; meta dict) from a checkpoint."""
    from safetensors.torch import load_file

    if not (directory / "state.json").is_file():
        raise CheckpointError(f"checkpoint {str(directory)!r} is incomplete: missing ['state.json']")
    meta = json.loads((directory / "state.json").read_text())
    num_shards = int(meta.get("num_shards", 1))
    files = {name: _shard_file(name, shard, num_shards) for name in _FILES[:3]}
    missing = [f for f in [*files.values(), "rng.safetensors"] if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {str(directory)!r} is incomplete: missing {missing}")
    rng_all = load_file(str(directory / "rng.safetensors"))
    prefix = f"rank{rank}."
    rng = {k[len(prefix) :]: v for k, v in rng_all.items() if k.startswith(prefix)}
    if not rng:
        raise CheckpointError(f"checkpoint {str(directory)!r} has no RNG state for rank {rank}")
    param_groups = meta.get("shard_param_groups", {}).get(str(shard), meta["param_groups"])
    state = {
        **{name: load_file(str(directory / file)) for name, file in files.items()},
        "rng": rng,
        "json": {"param_groups": param_groups, "scheduler": meta["scheduler"]},
    }
    return state, meta


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``checkpoints/step_*`` directory of a run, or None."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    steps = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    return steps[-1] if steps else None


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (0 keeps all)."""
    if keep_last <= 0:
        return
    steps = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    for old in steps[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
