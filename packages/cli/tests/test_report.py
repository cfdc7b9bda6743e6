"""The plot, the live display and the summary render what the trainer reports (synthetic metric rows)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from entrepot.cli import _metrics as m
from entrepot.cli._live import TrainDisplay
from entrepot.cli._plot import plot_curves


def _rows(steps: int) -> list[dict[str, float]]:
    rows = []
    for step in range(1, steps + 1):
        row = {m.STEP: step, m.REWARD: step / steps, m.KL: 0.01 * step, m.ELAPSED: 0.5 * step,
               m.STEP_TIME: 0.5, "time/rollout": 0.3, "time/update": 0.2, m.TOKENS_PER_S: 1234.0}  # fmt: skip
        if step % 5 == 0:
            row[m.ACCURACY] = step / steps
        rows.append(row)
    return rows


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = plot_curves(_rows(20), tmp_path / "curves.png", "test run")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5_000


def test_read_metrics_round_trips_jsonl(tmp_path: Path) -> None:
    file = tmp_path / "metrics.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    assert m.read_metrics(file) == _rows(3)
    assert m.read_metrics(tmp_path / "absent.jsonl") == []


def test_stage_times_leave_out_totals() -> None:
    assert m.stage_times(_rows(1)[0]) == {"rollout": 0.3, "update": 0.2}


def test_live_display_shows_latest_metrics_and_last_accuracy() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=False)
    with TrainDisplay(total_steps=20, start_step=0, console=console) as display:
        for row in _rows(20)[:7]:
            display.update(row)
    text = out.getvalue()
    assert "7/20" in text
    assert "0.350" in text  # the latest reward (7/20)
    assert "eval accuracy" in text and "0.250" in text  # the accuracy of step 5 stays shown at step 7
    assert "rollout 300ms" in text


def test_summary_reports_when_accuracy_first_reached_the_target(tmp_path: Path) -> None:
    from entrepot.cli._report import print_summary
    from entrepot.grpo import TrainResult

    out = io.StringIO()
    ckpt = tmp_path / "ckpt"
    result = TrainResult(run_dir=tmp_path, steps=20, final_metrics=_rows(20)[-1], checkpoint=ckpt)
    print_summary(Console(file=out, width=120), result, _rows(20), tmp_path, tmp_path / "curves.png", 12.0)
    text = out.getvalue()
    assert "step 20 (10.0 s)" in text  # accuracy 0.25, 0.5, 0.75, 1.0 at steps 5..20; 0.5 s per step
    assert "training time (all steps)" in text and "10.0 s" in text
    assert str(tmp_path / "ckpt") in text
