"""`rl grpo samples` and the live display's sample line, from a samples.jsonl written here (no training).

The records are what `entrepot.grpo.run.samples` writes; a training run that writes them is tested
in entrepot-grpo's tests/test_samples.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from entrepot.cli._live import TrainDisplay, sample_line
from entrepot.cli.app import app


def _record(step: int, i: int) -> dict[str, object]:
    return {"step": step, "prompt": f"p{step}-{i}=", "response": f"r{step}-{i}", "answer": "42",
            "reward": 0.5 * i, "parts": {"partial_credit": 0.5 * i}, "accuracy": float(i == 2)}  # fmt: skip


def _run(tmp_path: Path) -> Path:
    lines = [json.dumps(_record(step, i)) for step in (10, 20) for i in range(3)]
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_samples_table_shows_the_newest_step_by_default(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["grpo", "samples", str(_run(tmp_path))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "p20-0=" in result.stdout and "r20-2" in result.stdout and "p10-0=" not in result.stdout
    assert "partial_credit=1.000" in result.stdout and "yes" in result.stdout


def test_samples_step_and_last(runner: CliRunner, tmp_path: Path) -> None:
    run = _run(tmp_path)
    result = runner.invoke(
        app, ["grpo", "samples", str(run), "--step", "10", "--last", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "p10-2=" in result.stdout and "p10-1=" not in result.stdout and "p20" not in result.stdout
    result = runner.invoke(app, ["grpo", "samples", str(run), "--last", "4"], env={"COLUMNS": "200"})
    assert "p10-2=" in result.stdout and "p20-2=" in result.stdout and "p10-1=" not in result.stdout


def test_samples_errors_exit_2_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["grpo", "samples", str(tmp_path)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "has no samples.jsonl" in result.stderr
    result = runner.invoke(app, ["grpo", "samples", str(_run(tmp_path)), "--step", "5"])
    assert result.exit_code == 2 and "--step 5: no samples; sampled steps: 10, 20" in result.stderr


def test_samples_are_blocks_that_fit_80_columns(runner: CliRunner, tmp_path: Path) -> None:
    """However wide the terminal, a sample is a block of at most 80 columns: header, then each text."""
    long = {**_record(30, 0), "prompt": "<|im_start|>user\n" + "How many apples are left? " * 12,
            "response": "He has 12 + 7 = 19 apples, " * 8 + "#### 13", "answer": "13"}  # fmt: skip
    (tmp_path / "samples.jsonl").write_text(json.dumps(long) + "\n" + json.dumps(_record(30, 2)) + "\n")
    result = runner.invoke(app, ["grpo", "samples", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    headers = [line for line in lines if line.startswith("-- step 30")]
    assert headers == [
        "-- step 30  reward 0.000  correct no " + "-" * 43,
        "-- step 30  reward 1.000  correct yes " + "-" * 42,
    ]
    first = lines[: lines.index(headers[1])]
    assert first[1:4] == ["parts: partial_credit=0.000", "prompt:", "  <|im_start|>user"]
    assert "response:" in first and "answer:" in first and first[first.index("answer:") + 1] == "  13"
    # wrapped, not cut: the words of the response are all there, in order
    response = first[first.index("response:") + 1 : first.index("answer:")]
    assert " ".join(line.strip() for line in response) == long["response"]


def test_live_display_shows_the_latest_sample_on_one_line() -> None:
    sample = {**_record(10, 1), "prompt": "a long\nprompt " * 20}
    assert sample_line(_record(10, 1)) == "sample: p10-1= -> r10-1 (reward 0.500)"
    out = io.StringIO()
    with TrainDisplay(total_steps=20, console=Console(file=out, width=60)) as display:
        display.update({"step": 10, "reward_mean": 0.5, "samples": [sample]})
        display.update({"step": 11, "reward_mean": 0.5})  # a step without samples keeps the last one
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.startswith("sample:")]
    assert lines and all(line.endswith("…") and len(line) <= 60 for line in lines)
