"""The plot, the live display and the summary render what the trainer reports (synthetic metric rows)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from entrepot.cli import _metrics as m
from entrepot.cli._live import TrainDisplay, dock_line, weight_sync_line
from entrepot.cli._plot import PANELS, curves_figure, plot_curves

# metrics.jsonl of a real run (entrepot.grpo.train, the default task in process, eval every 3 steps):
# 6 steps, then resumed to 10, so steps 1 and 7 carry the start-up of their session.
REAL_METRICS = Path(__file__).parent / "data" / "metrics_reverse_10_steps.jsonl"


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


@pytest.mark.parametrize("num_steps", [3, 10])
def test_plot_step_axes_tick_whole_steps(num_steps: int) -> None:
    records = m.with_elapsed(m.read_metrics(REAL_METRICS)[:num_steps])
    step_axes = curves_figure(records, "run").axes[0::2]  # rows of (by step, by time)
    for axis in step_axes:
        low, high = axis.get_xlim()
        ticks = [t for t in axis.get_xticks() if low <= t <= high]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    assert step_axes[-1].get_xlabel() == "step"


def test_plot_has_a_kl_panel_and_names_each_metric() -> None:
    records = m.with_elapsed(m.read_metrics(REAL_METRICS))
    axes = curves_figure(records, "run").axes
    assert [axis.get_ylabel() for axis in axes] == [label for _, label, _ in PANELS for _ in range(2)]
    assert all(key in label for key, label, _ in PANELS)
    kl_by_step = next(axis for axis in axes[0::2] if axis.get_ylabel() == f"KL to the reference ({m.KL})")
    (line,) = kl_by_step.lines
    assert np.asarray(line.get_xdata()).tolist() == [r[m.STEP] for r in records]
    assert np.asarray(line.get_ydata()).tolist() == [r[m.KL] for r in records]
    assert max(r[m.KL] for r in records) > 0


def test_plot_time_axis_starts_at_zero_without_start_up() -> None:
    raw = m.read_metrics(REAL_METRICS)
    assert [r[m.STEP] for r in raw if m.STARTUP in r] == [1, 7]  # two sessions, each with a start-up
    axes = curves_figure(m.with_elapsed(raw), "run").axes
    by_time = axes[1]  # reward over training time
    assert by_time.get_xlim()[0] == 0
    times = np.asarray(by_time.lines[0].get_xdata(), dtype=float)
    assert times[0] == pytest.approx(raw[0][m.STEP_TIME])  # step 1 ends after its own time only
    steps_and_evals = sum(r[m.STEP_TIME] + r.get(m.EVAL_TIME, 0.0) for r in raw)
    assert times[-1] == pytest.approx(steps_and_evals)  # neither session's start-up is on the axis
    assert "start-up excluded" in axes[-1].get_xlabel()


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


def _dock_record(step: int) -> dict[str, float]:
    """A step as the trainer reports it with dynamic sampling: rollout and reward read 8 refilled rows."""
    record: dict[str, float] = {**_rows(step)[-1]}
    reads = {  # consumer: (rows, bytes, wait seconds), in the trainer's (not the pipeline's) order
        "actor_rollout": (264, 19008, 0.0003), "ref_log_prob": (256, 33808, 0.0421),
        "rule_reward": (264, 17816, 0.0), "compute_advantage": (256, 3072, 0.0),
        "actor_train": (256, 41496, 1.5), "grpo_metrics": (256, 3072, 0.0001),
    }  # fmt: skip
    for consumer, (rows, nbytes, wait_s) in reads.items():
        record[f"dock/{consumer}/rows"] = float(rows)
        record[f"dock/{consumer}/bytes"] = float(nbytes)
        if wait_s:  # the trainer leaves out figures that did not change
            record[f"dock/{consumer}/wait_s"] = wait_s
    return record


def test_dock_figures_in_pipeline_order_with_missing_figures_as_zero() -> None:
    record = {"dock/custom_stage/rows": 4.0, **_dock_record(3), "dock/actor_log_prob/wait_s": 0.25}
    figures = m.dock_figures(record)
    assert list(figures) == ["actor_rollout", "rule_reward", "ref_log_prob", "actor_log_prob",
                             "compute_advantage", "actor_train", "grpo_metrics", "custom_stage"]  # fmt: skip
    assert figures["rule_reward"] == m.DockFigures(rows=264.0, nbytes=17816.0, wait_s=0.0)
    assert figures["actor_log_prob"] == m.DockFigures(wait_s=0.25)
    assert m.dock_figures(_rows(1)[0]) == {}


def test_dock_line_says_the_shared_row_count_once() -> None:
    assert dock_line(_dock_record(3)) == (
        "dock 256 rows: rollout 264r 19kB 0ms  reward 264r 18kB 0ms  ref 34kB 42ms  adv 3kB 0ms  "
        "train 41kB 1500ms  metrics 3kB 0ms"
    )
    record = {"dock/actor_rollout/rows": 4.0, "dock/actor_rollout/bytes": 512.0,
              "dock/my_consumer/rows": 4.0, "dock/my_consumer/bytes": 2.5e6}  # fmt: skip
    assert dock_line(record) == "dock 4 rows: rollout 512B 0ms  my_consumer 2.5MB 0ms"
    assert dock_line(_rows(1)[0]) is None


def test_live_display_shows_the_dock_on_one_line() -> None:
    for width, whole in ((160, True), (60, False)):
        out = io.StringIO()
        with TrainDisplay(total_steps=20, console=Console(file=out, width=width)) as display:
            display.update(_dock_record(3))
        lines = [line for line in out.getvalue().splitlines() if line.startswith("dock")]
        assert len(lines) == 1, out.getvalue()  # never wrapped onto a second line
        line = lines[0].rstrip()
        if whole:
            assert line == dock_line(_dock_record(3))
        else:  # too narrow: cut with an ellipsis
            assert line.endswith("…") and len(line) <= width
        assert "stages: rollout 300ms" in out.getvalue()


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


def _summary(configs_dir: Path, tmp_path: Path, final_reward: float, config_file: str | None) -> str:
    from entrepot.cli._report import print_summary
    from entrepot.grpo import TrainResult
    from entrepot.grpo.config import load_config

    rows = _rows(4)
    rows[-1][m.REWARD] = final_reward
    config = load_config(configs_dir / config_file if config_file else None)
    result = TrainResult(run_dir=tmp_path, steps=4, final_metrics=rows[-1], checkpoint=None)
    out = io.StringIO()
    print_summary(Console(file=out, width=400), result, rows, tmp_path, None, 1.0, config)
    return out.getvalue()


def test_a_reward_negative_by_design_says_which_setting_makes_it_so(
    configs_dir: Path, tmp_path: Path
) -> None:
    """dr-grpo.yaml's overlong shaping takes up to 0.5 from a response: a mean below 0 is expected."""
    text = _summary(configs_dir, tmp_path, -0.125, "dr-grpo.yaml")
    (line,) = [row for row in text.splitlines() if "below 0" in row]
    assert "by design: reward.overlong_penalty (0.5) is taken from responses in the last" in line
    assert "reward.overlong_buffer (3) tokens" in line
    # not negative: nothing to say; the default's verifiers cannot go below 0
    assert "below 0" not in _summary(configs_dir, tmp_path, 0.25, "dr-grpo.yaml")
    assert "below 0" not in _summary(configs_dir, tmp_path, -0.125, None)


def test_weight_sync_line_shows_reshard_and_logp_mismatch() -> None:
    assert weight_sync_line({"step": 1, "reward_mean": 0.5}) is None  # torch engines: nothing to show
    record = {"reshard/seconds": 0.031, "reshard/gbps": 0.02, "rollout/logp_mismatch_mean": 7.1e-8,
              "rollout/logp_mismatch_max": 9.5e-7}  # fmt: skip
    assert weight_sync_line(record) == (
        "weight sync: reshard 31ms 0.02 GB/s  logp mismatch mean 7.10e-08 max 9.50e-07"
    )
