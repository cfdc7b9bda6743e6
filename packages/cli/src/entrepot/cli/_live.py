"""The live view of `rl grpo train`: a progress bar with ETA, the latest step's metrics and sample.

Fed by the trainer's `on_step` callback; it only formats what the trainer reports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from entrepot.cli import _metrics as m

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


# Short names of the dock consumers on the one-line dock summary.
_DOCK_SHORT = {
    "actor_rollout": "rollout",
    "rule_reward": "reward",
    "ref_log_prob": "ref",
    "actor_log_prob": "old_logp",
    "teacher_log_prob": "teacher",
    "compute_advantage": "adv",
    "actor_train": "train",
    "grpo_metrics": "metrics",
}


def weight_sync_line(metrics: Mapping[str, Any]) -> str | None:
    """Weight sync health of the step: reshard time and GB/s, the rollout / trainer log-prob mismatch."""
    parts = []
    seconds, gbps = m.number(metrics, m.RESHARD_SECONDS), m.number(metrics, m.RESHARD_GBPS)
    if seconds is not None:
        parts.append(f"reshard {seconds * 1000:.0f}ms" + (f" {gbps:.2f} GB/s" if gbps is not None else ""))
    mean, peak = m.number(metrics, m.LOGP_MISMATCH_MEAN), m.number(metrics, m.LOGP_MISMATCH_MAX)
    if mean is not None:
        parts.append(f"logp mismatch mean {mean:.2e}" + (f" max {peak:.2e}" if peak is not None else ""))
    return "weight sync: " + "  ".join(parts) if parts else None


SAMPLES = "samples"  # the trainer's on_step key of a sampled step's records (entrepot.grpo.step.SAMPLES_KEY)


def hacking_line(metrics: Mapping[str, Any]) -> str | None:
    """The reward-hacking audit's warning when a detector flags this step (``hacking/flag/<name>``), with
    each one's figure and the first step any flagged; None when none does (or the audit is off)."""
    flagged = sorted(key.removeprefix(HACKING_FLAG) for key in metrics if key.startswith(HACKING_FLAG))
    if not flagged:
        return None
    parts = [f"{name} {_fmt(m.number(metrics, 'hacking/' + name))}" for name in flagged]
    since = m.number(metrics, "hacking/first_flag_step")
    first = "" if since is None else f" (first flagged at step {int(since)})"
    where = "the audit thresholds in entrepot-grpo's docs/checkpoints.md"
    return f"reward hacking? {', '.join(parts)}{first}: see {where}"


HACKING_FLAG = "hacking/flag/"


def sample_line(sample: Mapping[str, Any]) -> str:
    """`sample: PROMPT -> RESPONSE (reward R)` of one sample record, each text on one line."""
    prompt, response = (" ".join(str(sample.get(k, "")).split()) for k in ("prompt", "response"))
    reward = m.number(sample, "reward")
    return f"sample: {prompt} -> {response} (reward {_fmt(reward)})"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_bytes(count: float) -> str:
    """Decimal units, two or three significant digits: 512B, 3kB, 18kB, 1.2MB, 40MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.1f}{unit}" if value < 10 and unit != "kB" else f"{value:.0f}{unit}"
    return f"{count:.0f}B"


def dock_line(record: Mapping[str, Any]) -> str | None:
    """One line of what every dock consumer read this step, or None when the step has no dock keys.

    `dock 256 rows: rollout 18kB 0ms  reward 18kB 0ms  ref 34kB 0ms ...`: the row count most
    consumers share is said once; a consumer that read a different count (dynamic sampling
    refills rollout and reward) shows its own (`rollout 264r`). Consumer names are shortened.
    """
    figures = m.dock_figures(record)
    if not figures:
        return None
    common = Counter(f.rows for f in figures.values()).most_common(1)[0][0]
    parts = []
    for consumer, f in figures.items():
        rows = "" if f.rows == common else f" {f.rows:.0f}r"
        name = _DOCK_SHORT.get(consumer, consumer)
        parts.append(f"{name}{rows} {_fmt_bytes(f.nbytes)} {f.wait_s * 1000:.0f}ms")
    return f"dock {common:.0f} rows: " + "  ".join(parts)


class TrainDisplay:
    """A rich Live panel; `update(metrics)` after every step, used as a context manager.

    Args:
        total_steps: the run's max_steps (the bar's total).
        start_step: steps already done (resumed runs start part-way).
        console: where to draw; quiet runs pass none and get one line every `print_every` steps.
    """

    def __init__(self, total_steps: int, start_step: int = 0, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("steps", total=total_steps, completed=start_step)
        self.latest: dict[str, Any] = {}
        self.accuracy: float | None = None
        self.sample: Mapping[str, Any] | None = None  # the latest sampled step's first record
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> TrainDisplay:
        self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.update(self._render())
        self.live.__exit__(kind, exc, tb)

    def update(self, metrics: Mapping[str, Any]) -> None:
        """Show one finished step (the trainer's `on_step` payload)."""
        self.latest = dict(metrics)
        accuracy = m.number(metrics, m.ACCURACY)
        if accuracy is not None:
            self.accuracy = accuracy
        samples = metrics.get(SAMPLES)
        if samples:
            self.sample = samples[0]
        step = m.number(metrics, m.STEP)
        if step is not None:
            self.progress.update(self.task, completed=int(step))
        self.live.update(self._render())

    def _render(self) -> RenderableType:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        latest = self.latest
        table = Table.grid(padding=(0, 2))
        for _ in range(6):
            table.add_column(justify="right")
        rows = [
            ("reward", _fmt(m.number(latest, m.REWARD))),
            ("eval accuracy", _fmt(self.accuracy)),
            ("KL", _fmt(m.number(latest, m.KL), 4)),
            ("tokens/s", _fmt(m.number(latest, m.TOKENS_PER_S), 0)),
            ("train accuracy", _fmt(m.number(latest, m.TRAIN_ACCURACY))),
            ("step time", f"{_fmt(m.number(latest, m.STEP_TIME), 2)} s"),
        ]
        table.add_row(*(cell for pair in rows[:3] for cell in pair))
        table.add_row(*(cell for pair in rows[3:] for cell in pair))
        stages = m.stage_times(latest)
        stage_line = "  ".join(f"{name} {seconds * 1000:.0f}ms" for name, seconds in stages.items())
        lines: list[RenderableType] = [self.progress, table, f"[dim]stages: {stage_line or '-'}"]
        hacking = hacking_line(latest)
        if hacking is not None:
            lines.append(Text(hacking, style="bold yellow", no_wrap=True, overflow="ellipsis"))
        sync = weight_sync_line(latest)
        if sync is not None:
            lines.append(f"[dim]{sync}")
        dock = dock_line(latest)
        if dock is not None:  # one line whatever the width: cut with an ellipsis, never wrapped
            lines.append(Text(dock, style="dim", no_wrap=True, overflow="ellipsis"))
        if self.sample is not None:
            lines.append(Text(sample_line(self.sample), no_wrap=True, overflow="ellipsis"))
        return Group(*lines)
