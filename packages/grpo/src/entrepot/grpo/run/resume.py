"""Which checkpoint a resume continues from, checked to be its run's own before anything starts.

`resume_point(run_dir, config)` runs before Ray, the workers or torch start (`train` and
`rl grpo train --resume` call it first). It refuses, with a `CheckpointError` naming the file:

- a run folder that holds a symbolic link (`identity.check_no_links`);
- a run folder without its identity (``run.json``, written when the run was created);
- the newest complete checkpoint (``checkpoints/step_*`` with a manifest) when a file does not match
  the manifest, when its manifest names another run (a checkpoint copied over one of the run's, added
  as a newer ``step_*`` or linked in) or no run (format 1), or when its step is not the one its
  folder is named for (a checkpoint of the run copied or renamed);

and a config that changes a key fixed for the run (`identity.check_config_unchanged`,
GRPOConfigError). Newer checkpoints without a manifest (saves that were stopped) are skipped.
Free of heavy imports, like everything it calls.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run.identity import RUN_FILE, RunIdentity, check_config_unchanged, check_no_links, read_run
from entrepot.grpo.run.manifest import MANIFEST, Manifest, verify_manifest

__all__ = [
    "ResumePoint",
    "check_belongs",
    "incomplete_checkpoints",
    "latest_checkpoint",
    "nothing_to_resume",
    "resume_point",
]


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resume continues from, verified against its manifest and its run.

    Attributes:
        directory: the ``checkpoints/step_*`` directory.
        step: its step (what the resumed run has done).
        owner: the run's identity (the resumed run's checkpoints carry it on).
        manifest: the verified manifest (by size only for the files outside `hash_only`, when given).
        skipped: newer ``step_*`` directories without a manifest (saves that were stopped).
    """

    directory: Path
    step: int
    owner: RunIdentity
    manifest: Manifest
    skipped: list[str] = field(default_factory=list)


def _complete(directory: Path) -> bool:
    return directory.is_dir() and not directory.name.endswith(".tmp") and (directory / MANIFEST).is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``checkpoints/step_*`` directory of a run that has a manifest (a save that was
    stopped half-way has none and is skipped), or None."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    steps = sorted(p for p in root.glob("step_*") if _complete(p))
    return steps[-1] if steps else None


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """A run's ``checkpoints/step_*`` directories without a manifest (``.tmp`` ones included): saves
    that were stopped before the end, or checkpoints written before manifests."""
    root = run_dir / "checkpoints"
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not _complete(p)) if root.is_dir() else []


def nothing_to_resume(run_dir: Path) -> str:
    """Why a run directory has no checkpoint to resume from (none at all, or none complete)."""
    partial = [p.name for p in incomplete_checkpoints(run_dir)]
    if not partial:
        return f"nothing to resume: {str(run_dir)!r} has no checkpoints/step_* directory"
    return (
        f"nothing to resume: {str(run_dir)!r} has no complete checkpoint; {partial} lack {MANIFEST} "
        "(saves that were stopped, or written by entrepot-grpo < 0.3, which wrote none)"
    )


def check_belongs(manifest: Manifest, owner: RunIdentity) -> int:
    """The checkpoint's step, once its manifest shows it was written by `owner` for its folder's step.

    Raises CheckpointError naming the checkpoint and both identities (runs, or steps).
    """
    directory = manifest.directory
    where = f"checkpoint {str(directory)!r}"
    remedy = "remove it and resume again (the resume then continues from the run's newest own checkpoint)"
    if manifest.owner is None or manifest.step is None:
        raise CheckpointError(
            f"{where} names no run: its {MANIFEST} is format 1 (entrepot-grpo 0.3.0), so it cannot be "
            f"shown to belong to this folder's {owner} ({RUN_FILE}); {remedy}"
        )
    if manifest.owner != owner:
        raise CheckpointError(
            f"{where} belongs to another run: its {MANIFEST} says {manifest.owner}, this run folder's "
            f"{RUN_FILE} says {owner}; {remedy}, or start a new run from its weights (model.path at an "
            "exported model directory)"
        )
    named = f"step_{manifest.step:06d}"
    if directory.name != named:
        raise CheckpointError(
            f"{where} is step {manifest.step} of {owner} ({named} in its {MANIFEST}), not the step its "
            f"folder is named for: a checkpoint copied or renamed; {remedy}"
        )
    saved = json.loads((directory / "state.json").read_text()).get("step")  # verified with the manifest
    if saved != manifest.step:
        raise CheckpointError(f"{where}: state.json says step {saved}, its {MANIFEST} says {manifest.step}")
    return manifest.step


def resume_point(
    run_dir: Path, config: GRPOConfig, *, hash_only: Collection[str] | None = None
) -> ResumePoint:
    """The newest complete checkpoint of `run_dir`, checked to be the run's own, for resuming `config`.

    Args:
        run_dir: the run folder.
        config: the config the resumed run will train with (its fixed keys must be the run's).
        hash_only: hash only these files of the checkpoint and check the others' sizes (the CLI's
            "already finished" check; the resume that follows hashes every file).

    Raises:
        CheckpointError: see the module docstring; the message names the file.
        GRPOConfigError: `config` changes a key fixed for the run.
    """
    check_no_links(run_dir)
    owner = read_run(run_dir)
    directory = latest_checkpoint(run_dir)
    if directory is None:
        raise CheckpointError(nothing_to_resume(run_dir))
    manifest = verify_manifest(directory, hash_only=hash_only)
    step = check_belongs(manifest, owner)
    check_config_unchanged(run_dir, config)
    skipped = [p.name for p in incomplete_checkpoints(run_dir) if p.name > directory.name]
    return ResumePoint(directory, step, owner, manifest, skipped)
