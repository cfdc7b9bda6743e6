"""`rl batching plan`: lengths in, DP ranks and budgeted micro-batches out (through entrepot.batching)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from entrepot.cli._batching_plan import PlanRequest, compute_plan
from entrepot.cli._lengths import Distribution, generate_lengths, read_lengths
from entrepot.cli.app import app


def test_plan_covers_every_sequence_once_within_budget_and_groups() -> None:
    lengths = generate_lengths(Distribution.lognormal, 48, 300.0, 16, 1024, seed=3)
    request = PlanRequest(budget=1500, max_micro_batch_size=6, num_ranks=3, group_size=4)
    result = compute_plan(lengths, request)
    seen = sorted(i for rank in result.ranks for batch in rank.micro_batches for i in batch)
    assert seen == list(range(48))
    for rank in result.ranks:
        assert sorted(i for batch in rank.micro_batches for i in batch) == sorted(rank.indices)
        members = set(rank.indices)
        assert all({i // 4 * 4 + k for k in range(4)} <= members for i in members)  # whole groups
        for batch in rank.micro_batches:
            assert sum(lengths[i] for i in batch) <= 1500
            assert len(batch) <= 6
    assert 0.0 <= result.imbalance < 0.2


def test_generated_lengths_are_seeded_and_clamped() -> None:
    first = generate_lengths(Distribution.exponential, 200, 100.0, 10, 300, seed=1)
    assert first == generate_lengths(Distribution.exponential, 200, 100.0, 10, 300, seed=1)
    assert first != generate_lengths(Distribution.exponential, 200, 100.0, 10, 300, seed=2)
    assert min(first) >= 10 and max(first) <= 300


def test_lengths_file_accepts_whitespace_commas_and_json(tmp_path: Path) -> None:
    file = tmp_path / "lengths.txt"
    file.write_text("[12, 40,\n7 9]")
    assert read_lengths(file) == [12, 40, 7, 9]


def test_cli_prints_both_tables(runner: CliRunner, tmp_path: Path) -> None:
    file = tmp_path / "lengths.txt"
    file.write_text("100 200 300 400 500 600 700 800")
    result = runner.invoke(
        app,
        ["batching", "plan", "-f", str(file), "--budget", "1000", "--num-ranks", "2", "--show-indices"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "micro-batches (budget 1000 tokens)" in result.stdout
    assert "imbalance max/mean - 1 = 0.0000" in result.stdout  # 1800 | 1800
    assert "8 sequences, 3600 tokens" in result.stdout


def test_cli_user_mistakes_exit_2_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    too_long = runner.invoke(app, ["batching", "plan", "--count", "8", "--budget", "100"])
    assert too_long.exit_code == 2
    assert "more than max_token_len=100" in too_long.stderr
    assert len(too_long.stderr.strip().splitlines()) == 1
    groups = runner.invoke(app, ["batching", "plan", "--count", "10", "--group-size", "4"])
    assert groups.exit_code == 2
    assert "group_size=4" in groups.stderr
    bad_file = tmp_path / "bad.txt"
    bad_file.write_text("10 x 30")
    bad = runner.invoke(app, ["batching", "plan", "-f", str(bad_file)])
    assert bad.exit_code == 2
    assert "entry 1 ('x') must be a positive integer length" in bad.stderr
    missing = runner.invoke(app, ["batching", "plan", "-f", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr
