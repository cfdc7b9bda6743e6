"""The distillation teacher (`algorithm.distill.teacher`): resolved and checked before start, loaded frozen.

| teacher path                         | loaded                                                         |
|--------------------------------------|----------------------------------------------------------------|
| an HF model directory (config.json)  | `load_pretrained`                                              |
| a checkpoint (``checkpoints/step_N``)| verified against its manifest; its run's model holding its     |
| or a run directory (newest one)      | weights (`run.export.load_trained`), or its ``hf/`` export     |
|                                      | (LoRA, megatron)                                               |

`evaluation.target.resolve_target` decides which, as for ``rl eval``. Log-probs of one token id must
mean the same token under teacher and student: `check_teacher` refuses a teacher whose vocabulary
size is not the policy's, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo.errors import DataError, GRPOError

__all__ = ["KEY", "TeacherSource", "check_teacher", "load_teacher", "resolve_teacher"]

KEY = "algorithm.distill.teacher"


@dataclass(frozen=True)
class TeacherSource:
    """A resolved teacher.

    Attributes:
        path: as configured.
        model_dir: the HF directory loaded (an HF teacher, or a LoRA / megatron checkpoint's ``hf/``).
        checkpoint: the checkpoint directory (None for an HF directory).
        config: the checkpoint's run config (None for an HF directory).
        step: the checkpoint's step (None for an HF directory).
        manifest_sha256: the checkpoint manifest's digest (None for an HF directory).
    """

    path: str
    model_dir: Path | None
    checkpoint: Path | None = None
    config: Any = None
    step: int | None = None
    manifest_sha256: str | None = None

    def describe(self) -> str:
        """The start-up line naming the teacher."""
        if self.checkpoint is None:
            return f"distillation teacher: HF model directory {self.path!r}"
        digest = (self.manifest_sha256 or "")[:12]
        where = f"checkpoint {str(self.checkpoint)!r}"
        return f"distillation teacher: {where} (step {self.step}, manifest {digest})"


def resolve_teacher(path: str) -> TeacherSource:
    """The teacher `path` names, verified (a damaged checkpoint is refused); a `DataError` naming the key."""
    from entrepot.grpo.engines.registry import choose_engines
    from entrepot.grpo.evaluation.target import resolve_target

    try:
        target = resolve_target(path)
    except GRPOError as exc:
        raise DataError(f"{KEY} ({path!r}): {exc}") from None
    if target.checkpoint is None:
        return TeacherSource(path, target.model_dir)
    config = target.config
    exported = config.model.lora.enabled or choose_engines(config.engine).train.shards_weights
    hf = target.checkpoint / "hf"
    if exported and not (hf / "config.json").is_file():
        raise DataError(f"{KEY} ({path!r}): checkpoint {str(target.checkpoint)!r} has no HF export (hf/)")
    return TeacherSource(path, hf if exported else None, target.checkpoint, config, target.step,
                         target.manifest_sha256)  # fmt: skip


def _vocab_size(source: TeacherSource) -> int | None:
    """The teacher's vocabulary size, read from configs only (no weights)."""
    from entrepot.grpo.engines.models import load_model_config

    if source.model_dir is not None:
        return getattr(load_model_config(source.model_dir, key=KEY), "vocab_size", None)
    config = source.config  # a torch-engine checkpoint: its run's model is model.path's or the built decoder
    if config.model.path is not None:
        return getattr(load_model_config(config.model.path, key=f"{KEY}'s model.path"), "vocab_size", None)
    from entrepot.grpo.data.sources import build_task

    return int(build_task(config).tokenizer.vocab_size)


def check_teacher(path: str, policy_vocab: int | None) -> TeacherSource:
    """Resolve the teacher and refuse one whose vocabulary size is not `policy_vocab` (None: unknown)."""
    source = resolve_teacher(path)
    theirs = _vocab_size(source)
    if policy_vocab is not None and theirs != policy_vocab:
        raise DataError(
            f"{KEY} ({path!r}) has a vocabulary of {theirs} tokens, the policy {policy_vocab}: the teacher "
            "scores the student's token ids, so both must use the same tokenizer"
        )
    return source


def load_teacher(source: TeacherSource, device: str) -> torch.nn.Module:
    """The teacher, frozen in eval mode on `device` (float32). The global RNG is left as it was (the
    checkpoint's run model is built from its own seed)."""
    from entrepot.grpo.engines.models import load_pretrained

    with torch.random.fork_rng(devices=[]):
        if source.model_dir is not None:
            model, _ = load_pretrained(source.model_dir, with_tokenizer=False, key=KEY)
        else:
            from entrepot.grpo.run.export import load_trained

            assert source.checkpoint is not None  # a torch-engine checkpoint
            model, _ = load_trained(source.checkpoint, source.config)
    return model.to(device, dtype=torch.float32).requires_grad_(False).eval()
