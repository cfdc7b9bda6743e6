"""What `rl eval PATH` evaluates, resolved and checked before any model loads.

| PATH                                   | evaluated                                                 |
|----------------------------------------|-----------------------------------------------------------|
| a run directory                        | its newest complete checkpoint, or ``step`` 's            |
| a checkpoint (``checkpoints/step_N``)  | that checkpoint                                           |
| an HF model directory (an export, a    | its weights as ``model.path`` of the given config (or of |
| local model)                           | the run it was exported from, or the default)             |

A checkpoint is verified against its manifest (every file's size and sha256) first: a damaged one is
a `CheckpointError` naming the file. No torch here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig, config_from_dict, load_config
from entrepot.grpo.errors import CheckpointError, EvalError
from entrepot.grpo.run.export import checkpoint_directory
from entrepot.grpo.run.identity import RUN_FILE
from entrepot.grpo.run.manifest import MANIFEST, verify_manifest

__all__ = ["EvalTarget", "resolve_target"]


@dataclass(frozen=True)
class EvalTarget:
    """A checked evaluation target.

    Attributes:
        config: the config its worker is built from (a checkpoint's own; an HF directory's as ``model.path``).
        checkpoint: the checkpoint directory (None for an HF directory).
        run_dir: the run it belongs to, when known (where ``rl eval compare`` puts its plot).
        run_id, step, manifest_sha256: the checkpoint's identity (None for an HF directory).
        model_dir: the HF directory evaluated (None for a checkpoint).
    """

    config: GRPOConfig
    checkpoint: Path | None = None
    run_dir: Path | None = None
    run_id: str | None = None
    step: int | None = None
    manifest_sha256: str | None = None
    model_dir: Path | None = None

    def provenance(self) -> dict[str, Any]:
        """What ``eval.json`` records of the evaluated model."""
        return {
            "path": str(self.checkpoint or self.model_dir),
            "kind": "checkpoint" if self.checkpoint is not None else "model_dir",
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "run_id": self.run_id,
            "step": self.step,
            "manifest_sha256": self.manifest_sha256,
        }


def resolve_target(
    path: str | Path, *, step: int | None = None, config_file: str | Path | None = None
) -> EvalTarget:
    """The checkpoint or model directory `path` names (see the module's table), verified.

    Raises:
        EvalError: `path` is none of them, or `step` with something other than a run directory.
        CheckpointError: a run directory without (complete) checkpoints, no checkpoint of `step`, or a
            checkpoint whose files do not match its manifest.
    """
    where = Path(path)
    if not where.exists():
        raise EvalError(
            f"{str(where)!r} does not exist (expected a run directory, a checkpoint or a model directory)"
        )
    if (where / RUN_FILE).is_file() or (where / "checkpoints").is_dir():
        if not (where / "checkpoints").is_dir():
            raise CheckpointError(
                f"run directory {str(where)!r} has no checkpoints (checkpoints/ is missing)"
            )
        return _checkpoint(checkpoint_directory(where, step), where)
    if step is not None:
        raise EvalError(f"--step {step} picks a checkpoint of a run directory; {str(where)!r} is not one")
    if (where / "state.json").is_file() or (where / MANIFEST).is_file():
        run_dir = where.parent.parent if where.parent.name == "checkpoints" else None
        return _checkpoint(where, run_dir)
    if (where / "config.json").is_file():
        return _model_dir(where, config_file)
    raise EvalError(
        f"{str(where)!r} is neither a run directory, a checkpoint (state.json) nor an HF model directory "
        "(config.json)"
    )


def _checkpoint(directory: Path, run_dir: Path | None) -> EvalTarget:
    manifest = verify_manifest(directory)  # every file: size and sha256
    meta = json.loads((directory / "state.json").read_text())
    config = config_from_dict(meta["config"])  # as it trained; `build_worker` makes it one process
    digest = hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()
    return EvalTarget(
        config=config, checkpoint=directory, run_dir=run_dir,
        run_id=None if manifest.owner is None else manifest.owner.run_id,
        step=int(meta["step"]), manifest_sha256=digest,
    )  # fmt: skip


def _model_dir(directory: Path, config_file: str | Path | None) -> EvalTarget:
    """An HF directory as `model.path` of `config_file`'s config; without one, the config of the run it
    was exported into (``RUN/export/step_N``), else the default."""
    run_dir = directory.parent.parent if directory.parent.name == "export" else None
    if config_file is not None:
        config = load_config(config_file)
    elif run_dir is not None and (run_dir / "config.yaml").is_file():
        config = load_config(run_dir / "config.yaml")
    else:
        config = GRPOConfig()
        run_dir = None
    resources = replace(config.resources, num_actor_workers=1, use_ray=False)
    config = replace(config, model=replace(config.model, path=str(directory)), resources=resources)
    return EvalTarget(config=config, run_dir=run_dir, model_dir=directory)
