"""Checkpoints: safetensors for every tensor, JSON for the rest, no pickle of anything loaded back.

A checkpoint directory ``checkpoints/step_000050/`` holds:
- ``model.safetensors`` / ``reference.safetensors``: parameters by HF name (tied weights once);
- ``optimizer.safetensors``: AdamW moments and step counts, keyed ``<param index>.<key>``;
- ``rng.safetensors``: the torch global RNG and the rollout sampler's generator state;
- ``dock.pt``: the dock's state_dict (plain tensors, read back with ``weights_only=True``);
- ``state.json``: step, data position, scheduler state, optimizer param groups, the config.
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


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().contiguous() for name, p in module.named_parameters()}


def capture_state(worker: Policy) -> dict[str, Any]:
    """Everything a rank needs to continue exactly: tensors per file plus JSON-able values."""
    optim = worker.optimizer.state_dict()
    optim_tensors = {
        f"{index}.{key}": torch.as_tensor(value).clone()
        for index, state in optim["state"].items()
        for key, value in state.items()
    }
    scheduler = {k: v for k, v in worker.scheduler.state_dict().items() if k != "lr_lambdas"}
    return {
        "model": _params(worker.model),
        "reference": _params(worker.reference) if worker.reference is not None else {},
        "optimizer": optim_tensors,
        "rng": {"torch": torch.get_rng_state(), "sampler": worker.generator.get_state()},
        "json": {"param_groups": optim["param_groups"], "scheduler": scheduler},
    }


def restore_state(worker: Policy, state: Mapping[str, Any]) -> None:
    """Load a `capture_state` result into a freshly built policy of the same config."""
    with torch.no_grad():
        for module, key in ((worker.model, "model"), (worker.reference, "reference")):
            if module is None:
                continue
            saved = state[key]
            for name, p in module.named_parameters():
                if name not in saved:
                    raise CheckpointError(f"checkpoint {key} has no parameter {name!r}")
                p.copy_(saved[name])
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for flat, value in state["optimizer"].items():
        index, key = flat.split(".", 1)
        per_param.setdefault(int(index), {})[key] = value
    groups = state["json"]["param_groups"]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    worker.optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    worker.scheduler.load_state_dict({**worker.scheduler.state_dict(), **state["json"]["scheduler"]})
    torch.set_rng_state(state["rng"]["torch"])
    worker.generator.set_state(state["rng"]["sampler"])


def write_checkpoint(
    directory: Path, rank_states: list[dict[str, Any]], meta: Mapping[str, Any], dock: Any = None
) -> Path:
    """Write one checkpoint (rank 0's model/optimizer; every rank's RNG) atomically via a temp dir."""
    from safetensors.torch import save_file

    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    first = rank_states[0]
    for name in ("model", "reference", "optimizer"):
        save_file(first[name], str(tmp / f"{name}.safetensors"))
    rng = {f"rank{r}.{k}": v for r, s in enumerate(rank_states) for k, v in s["rng"].items()}
    save_file(rng, str(tmp / "rng.safetensors"))
    if dock is not None:
        dock(tmp / "dock.pt")
    (tmp / "state.json").write_text(json.dumps({**meta, **first["json"]}, indent=1))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def read_checkpoint(directory: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state for `restore_state` of `rank`, meta dict) from a checkpoint directory."""
    from safetensors.torch import load_file

    missing = [f"{n}.safetensors" for n in _FILES if not (directory / f"{n}.safetensors").is_file()]
    if missing or not (directory / "state.json").is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is incomplete: missing {missing or ['state.json']}"
        )
    meta = json.loads((directory / "state.json").read_text())
    rng_all = load_file(str(directory / "rng.safetensors"))
    prefix = f"rank{rank}."
    rng = {k[len(prefix) :]: v for k, v in rng_all.items() if k.startswith(prefix)}
    if not rng:
        raise CheckpointError(f"checkpoint {str(directory)!r} has no RNG state for rank {rank}")
    state = {
        "model": load_file(str(directory / "model.safetensors")),
        "reference": load_file(str(directory / "reference.safetensors")),
        "optimizer": load_file(str(directory / "optimizer.safetensors")),
        "rng": rng,
        "json": {"param_groups": meta["param_groups"], "scheduler": meta["scheduler"]},
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
