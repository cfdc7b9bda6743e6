"""Exception types of entrepot.grpo: one base class, one subclass per kind of mistake."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DataError",
    "EnvironmentFailure",
    "EvalError",
    "GRPOConfigError",
    "GRPOError",
    "LogpMismatchError",
    "ModelImportError",
    "RayStartError",
    "RewardError",
    "RewardModelError",
    "RolloutLostError",
    "SandboxError",
    "StageError",
    "TemplateError",
    "UnknownRewardError",
    "WeightSyncError",
]


class GRPOError(Exception):
    """Base class of every error raised by entrepot.grpo."""


class GRPOConfigError(GRPOError, ValueError):
    """A configuration key has a wrong type, an impossible value, or does not exist.

    The message always names the dotted key, the offending value and what is allowed.
    """


class DataError(GRPOError, ValueError):
    """A prompt file or model directory is missing, malformed, or lacks a configured field."""


class EvalError(GRPOError, ValueError):
    """An evaluation cannot run as asked: a run directory without checkpoints, a data file that does not
    fit the task, pass@k with k above the samples per prompt, an engine it cannot use; the message names
    the path, row or value. Raised before any model loads."""


class ModelImportError(DataError):
    """A model file cannot be imported as an HF directory (`engines.model_import`): a missing file, an
    architecture not taken, an occupied output directory, or a missing extra; the message names the file."""


class RewardError(GRPOError, ValueError):
    """A reward verifier could not be registered, resolved or applied."""


class SandboxError(RewardError):
    """A sandbox limit is out of range, the isolation a run requires is missing on this machine, or a
    program's tests are not a list of Python sources; the message names the limit, step or row."""


class RewardModelError(GRPOError, ValueError):
    """A learned reward model's directory is not one this package can load, or a text it cannot score.

    The message names the directory, what is wrong and what is expected (and the row, for a text).
    """


class UnknownRewardError(RewardError, KeyError):
    """A reward name is not in the registry; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CheckpointError(GRPOError, RuntimeError):
    """A checkpoint directory is missing, incomplete, does not match the configuration, or is not its
    run's own (another run's checkpoint, a run folder holding a symbolic link)."""


class LogpMismatchError(GRPOError, RuntimeError):
    """The rollout engine's log-probs of its sampled tokens stray from the trainer's beyond
    ``engine.max_logp_mismatch`` (typically weights that did not reach the engine intact)."""


class WeightSyncError(GRPOError, RuntimeError):
    """Asynchronous training: published weights did not reach a rollout rank intact or in time.

    Attributes:
        source: the sending rank, e.g. ``actor rank 0``.
        target: the receiving rank, e.g. ``rollout rank 0``.
        version: the policy version being synced.
    """

    def __init__(self, source: str, target: str, version: int, reason: str) -> None:
        self.source, self.target, self.version, self.reason = source, target, version, reason
        super().__init__(f"weight sync of policy version {version} from {source} to {target}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, int, str]]:
        return (type(self), (self.source, self.target, self.version, self.reason))


class RolloutLostError(GRPOError, RuntimeError):
    """Asynchronous training: the rollout failed, or gave no finished group within the time allowed.

    Attributes:
        worker: the rollout rank, e.g. ``rollout rank 0``.
        reason: what went wrong (its error, or what it was doing when it stopped answering).
        details: the rollout's traceback, when it raised.
    """

    def __init__(self, worker: str, reason: str, details: str | None = None) -> None:
        self.worker, self.reason, self.details = worker, reason, details
        super().__init__(f"{worker} failed: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str | None]]:
        return (type(self), (self.worker, self.reason, self.details))


class TemplateError(GRPOError, ValueError):
    """A chat template is not append-only: rendering a conversation turn by turn gives other tokens
    than rendering it whole (multi-turn rollouts would train on tokens the model never saw).

    The message names the turn and the tokens where the two renderings part.
    """


class EnvironmentFailure(GRPOError, RuntimeError):
    """A multi-turn environment raised, timed out or returned something malformed, and
    ``multiturn.fail_fast`` is on (otherwise such a trajectory ends with the reason, and the step goes on)."""


class RayStartError(GRPOError, RuntimeError):
    """The run's local Ray did not come up within Ray's own start-up deadlines (an overloaded machine):
    the message gives the load and what to do. Nothing was trained."""


class StageError(GRPOError, RuntimeError):
    """A stage of a step failed on a worker (or did not answer in time).

    Attributes:
        stage: the stage (dock consumer) that failed, e.g. ``rule_reward``.
        worker: the worker, e.g. ``reward rank 0``.
        rows: the dock rows it was working on (None when it had not taken any).
        reason: what went wrong (the original exception's type and message).
        details: the worker's traceback of the original exception, when there was one.
    """

    def __init__(
        self, stage: str, worker: str, rows: list[int] | None, reason: str, details: str | None = None
    ) -> None:
        self.stage, self.worker, self.rows, self.reason, self.details = stage, worker, rows, reason, details
        where = "" if rows is None else f" on rows {_rows_text(rows)}"
        super().__init__(f"stage {stage!r} failed in {worker}{where}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, list[int] | None, str, str | None]]:
        return (type(self), (self.stage, self.worker, self.rows, self.reason, self.details))  # crosses Ray


def _rows_text(rows: list[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:8])
    return f"[{shown}{', ...' if len(rows) > 8 else ''}] ({len(rows)} rows)"
