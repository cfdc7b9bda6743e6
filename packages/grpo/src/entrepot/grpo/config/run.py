"""What a run keeps and measures around its steps: the `checkpoint`, `eval` and `logging` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath

from entrepot.grpo import _install
from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = ["CheckpointConfig", "EvalConfig", "LoggingConfig"]


@dataclass(kw_only=True)
class CheckpointConfig:
    """When to save (safetensors weights + JSON/torch state of optimizer, scheduler, RNG, data, dock)."""

    save_every: int = field(
        default=100, metadata=doc("Save every N steps (0 = only at the end and on Ctrl-C).")
    )
    keep_last: int = field(
        default=2, metadata=doc("Checkpoints kept on disk (older ones are deleted); 0 keeps all.")
    )

    def __post_init__(self) -> None:
        check(self.save_every >= 0, "checkpoint.save_every", self.save_every, ">= 0")
        check(self.keep_last >= 0, "checkpoint.keep_last", self.keep_last, ">= 0")


@dataclass(kw_only=True)
class EvalConfig:
    """Greedy evaluation on held-out prompts."""

    every: int = field(default=10, metadata=doc("Evaluate every N steps (0 = only at the end)."))
    num_prompts: int = field(default=256, metadata=doc("Held-out prompts per evaluation."))
    target_accuracy: float | None = field(
        default=None, metadata=doc("Stop once greedy accuracy reaches this; None runs all steps.")
    )

    def __post_init__(self) -> None:
        check(self.every >= 0, "eval.every", self.every, ">= 0")
        check(self.num_prompts >= 1, "eval.num_prompts", self.num_prompts, ">= 1")
        if self.target_accuracy is not None:
            check(0 < self.target_accuracy <= 1, "eval.target_accuracy", self.target_accuracy, "in (0, 1]")


@dataclass(kw_only=True)
class LoggingConfig:
    """Where metrics and samples go."""

    metrics_file: str = field(
        default="metrics.jsonl", metadata=doc("JSON-lines metrics file inside the run directory.")
    )
    tensorboard: bool | None = field(
        default=None,
        metadata=doc(
            "Also write TensorBoard scalars: true (tensorboard must be installed), false, or null "
            "(when it is installed)."
        ),
    )

    samples_every: int = field(
        default=10,
        metadata=doc(
            "At the first step and then every N steps write a few sampled prompts, responses, rewards "
            "and per-verifier parts to samples.jsonl in the run directory (0 = off)."
        ),
    )
    samples_per_step: int = field(
        default=4, metadata=doc("Samples written per sampled step (one response of each prompt first).")
    )
    wandb: bool = field(
        default=False,
        metadata=doc(
            f"Also log to Weights & Biases ({_install.WANDB}): scalars every step, a "
            "table of the samples, into RUN/wandb/."
        ),
    )
    wandb_project: str = field(default="entrepot", metadata=doc("The Weights & Biases project."))
    wandb_mode: str = field(
        default="offline",
        metadata=doc(
            "offline (files only; upload later with `wandb sync RUN/wandb/offline-run-*`) or online "
            "(needs `wandb login`); the WANDB_MODE environment variable, when set, wins."
        ),
    )

    def __post_init__(self) -> None:
        check(self.samples_every >= 0, "logging.samples_every", self.samples_every, ">= 0")
        check(self.samples_per_step >= 1, "logging.samples_per_step", self.samples_per_step, ">= 1")
        check_choice("logging.wandb_mode", self.wandb_mode, ("offline", "online"))
        check(bool(self.wandb_project), "logging.wandb_project", self.wandb_project, "a non-empty name")
        # every output of a run stays in its run directory: no absolute path, no way up
        path = PurePosixPath(self.metrics_file.replace("\\", "/"))
        check(
            bool(self.metrics_file) and not path.is_absolute() and ".." not in path.parts
            and not PureWindowsPath(self.metrics_file).drive,
            "logging.metrics_file", self.metrics_file,
            "a relative path inside the run directory (no leading '/', no '..')",
        )  # fmt: skip
