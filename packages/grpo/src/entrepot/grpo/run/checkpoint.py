"""Checkpoints: safetensors for every tensor, JSON for the rest, no pickle of anything loaded back.

A checkpoint directory ``checkpoints/step_000050/`` holds:
- ``model.safetensors`` / ``reference.safetensors`` (``model.shard003.safetensors`` ... when the
  model is split over TP x PP ranks: one file per shard): this rank's parameters (HF names for the torch
  engine, its TP / PP shard under global training names for megatron; tied weights once);
- ``optimizer.safetensors``: AdamW moments and step counts, keyed ``<param index>.<key>``;
- ``rng.safetensors``: the torch global RNG, the sampler's generator state and, on a GPU, the device RNG;
- ``dock.pt`` (+ its own ``dock.pt.manifest.json``): the dock's state_dict (plain tensors, read back
  with ``weights_only=True``);
- ``state.json``: step, data position, scheduler state, optimizer param groups (per shard), the config;
- ``hf/`` (megatron only): the whole model as an HF directory;
- ``manifest.json``, written last: every other file's path, size and sha256, the run that wrote it
  (its id and config hash, `entrepot.grpo.run.identity`) and the step.

A checkpoint is written into ``step_000050.tmp/``, manifest last, fsynced, then renamed; one without
a manifest (a save that was stopped) is never resumed from, and every file is checked against the
manifest before anything is loaded (`verify_checkpoint`). Which checkpoint a resume uses, and that
it is the run's own, is `entrepot.grpo.run.resume`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run.identity import RunIdentity
from entrepot.grpo.run.manifest import MANIFEST, Manifest, fsync_directory, verify_manifest, write_manifest
from entrepot.grpo.run.resume import incomplete_checkpoints, latest_checkpoint, nothing_to_resume

if TYPE_CHECKING:
    from entrepot.grpo.engines.policy import Policy

__all__ = [
    "Manifest",
    "capture_state",
    "checkpoint_step",
    "incomplete_checkpoints",
    "latest_checkpoint",
    "nothing_to_resume",
    "read_checkpoint",
    "restore_state",
    "verify_checkpoint",
    "write_checkpoint",
]

_FILES = ("model", "reference", "optimizer", "rng")


def _owns_storage(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is the whole contiguous storage it lives in (safetensors writes it as it is)."""
    whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    return tensor.is_contiguous() and tensor.storage_offset() == 0 and whole


def _on_host(tensor: torch.Tensor, *, copy: bool) -> torch.Tensor:
    """`tensor` as a contiguous host tensor of its own storage: itself when it is one and `copy` is
    False, else one copy (a device tensor's is made on the host directly, not copied there and again)."""
    tensor = tensor.detach()
    if not copy and tensor.device.type == "cpu" and _owns_storage(tensor):
        return tensor
    return tensor.to("cpu", copy=True, memory_format=torch.contiguous_format)


def _on_hosts(named: Mapping[str, torch.Tensor], *, copy: bool) -> dict[str, torch.Tensor]:
    return {name: _on_host(p, copy=copy) for name, p in named.items()}


def capture_state(worker: Policy) -> dict[str, Any]:
    """Everything a rank needs to continue exactly: tensors per file plus JSON-able values.

    Parameters are this rank's (the whole model for the torch engine; its TP / PP shard under
    global training names for megatron), so a run resumes with the layout it was saved with.
    Host tensors that own their storage are returned as they are, not copied (a 135M-parameter
    model's weights and AdamW moments are 1.5 GB), unless the engine offloads them after this
    (engine.offload_params, offload_optimizer, an offloaded reference empty their storages): the
    caller writes them, or Ray sends them, before the next step changes them (`ActorWorker.state`).
    """
    trainer = worker.trainer
    manager = worker.manager
    copy = manager.offload_train_params or manager.offload_optimizer or trainer.frozen_reference.offloads
    optim = trainer.torch_optimizer.state_dict()
    optim_tensors = {
        f"{index}.{key}": _on_host(torch.as_tensor(value), copy=copy)
        for index, state in optim["state"].items()
        for key, value in state.items()
    }
    scheduler = {k: v for k, v in trainer.scheduler.state_dict().items() if k != "lr_lambdas"}
    return {
        "model": _on_hosts(trainer.named_parameters(), copy=copy),
        "reference": _on_hosts(trainer.named_reference(), copy=copy),
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
    writers: Sequence[Callable[[Path], object]] = (),
    shards: list[int] | None = None,
    *,
    owner: RunIdentity,
) -> Path:
    """Write one checkpoint atomically: every file into a temp dir, then the manifest, then a rename.

    Args:
        rank_states: `capture_state()` of every rank.
        meta: state.json's values; ``meta["step"]`` is the step, also recorded in the manifest.
        writers: each writes more files into the temp directory it is given (the dock's state, an
            HF export); they run before the manifest, so it covers their files too.
        shards: each rank's model-parallel shard index (TP x PP position); ranks of one shard are
            data-parallel replicas, so the first of them is written. Default: one shard.
        owner: the run writing it (recorded in the manifest; a resume checks it).
    """
    from safetensors.torch import save_file

    shards = shards or [0] * len(rank_states)
    num_shards = len(set(shards))
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        written: set[int] = set()
        for state, shard in zip(rank_states, shards, strict=True):
            if shard in written:
                continue
            written.add(shard)
            for name in ("model", "reference", "optimizer"):
                save_file(state[name], str(tmp / _shard_file(name, shard, num_shards)))
        rng = {f"rank{r}.{k}": v for r, s in enumerate(rank_states) for k, v in s["rng"].items()}
        save_file(rng, str(tmp / "rng.safetensors"))
        for write in writers:
            write(tmp)
        # optimizer param groups differ between pipeline stages (each its own parameters): kept per shard
        groups: dict[str, Any] = {}
        for state, shard in zip(rank_states, shards, strict=True):
            groups.setdefault(str(shard), state["json"]["param_groups"])
        state_json = {
            **meta,
            **rank_states[0]["json"],
            "shard_param_groups": groups,
            "num_shards": num_shards,
        }
        (tmp / "state.json").write_text(json.dumps(state_json, indent=1))
        write_manifest(tmp, owner=owner, step=int(meta["step"]))  # last: with a manifest it is whole
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a save that failed (a lost dock shard) leaves nothing
        raise
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    fsync_directory(directory.parent)
    return directory


def verify_checkpoint(directory: Path) -> Manifest:
    """Check every file of a checkpoint against its manifest (size and sha256) before anything is read.

    Raises CheckpointError naming the checkpoint and the file: no manifest (an incomplete checkpoint,
    or one written before manifests), a listed file missing, truncated or corrupt.
    """
    return verify_manifest(directory)


def read_checkpoint(
    directory: Path, rank: int, shard: int = 0, *, verified: Manifest | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state for `restore_state` of `rank`, whose model shard is `shard`; meta dict) from a checkpoint.

    The checkpoint is verified first (`verify_checkpoint`) unless `verified` is its result already
    (a caller reading several ranks verifies once).
    """
    from safetensors.torch import load_file

    manifest = verified if verified is not None else verify_checkpoint(directory)
    meta = json.loads((directory / _listed(manifest, "state.json")).read_text())
    num_shards = int(meta.get("num_shards", 1))
    files = {name: _listed(manifest, _shard_file(name, shard, num_shards)) for name in _FILES[:3]}
    rng_all = load_file(str(directory / _listed(manifest, "rng.safetensors")))
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


def _listed(manifest: Manifest, name: str) -> str:
    """`name` if the manifest lists it (so it was verified), else a CheckpointError."""
    if name not in manifest.files:
        raise CheckpointError(
            f"checkpoint {str(manifest.directory)!r} is incomplete: {name} is not in its {MANIFEST}"
        )
    return name


def checkpoint_step(run_dir: Path) -> int:
    """The step of a run's newest complete checkpoint (0 if it has none); `resume.resume_point` also
    checks that it is the run's own.

    Reads that checkpoint's state.json after checking its hash, and the sizes of its other files
    (not their hashes: the resume that follows hashes every file, and hashing them twice would double
    the start-up cost of a large checkpoint for a number that only state.json holds).
    """
    directory = latest_checkpoint(run_dir)
    if directory is None:
        return 0
    manifest = verify_manifest(directory, hash_only={"state.json"})
    return int(json.loads((directory / _listed(manifest, "state.json")).read_text())["step"])


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (0 keeps all)."""
    if keep_last <= 0:
        return
    steps = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    for old in steps[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
