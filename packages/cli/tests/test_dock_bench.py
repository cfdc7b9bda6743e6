"""`rl dock bench`: every stage of every iteration moves every row through a real GRPODock."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from entrepot.cli._dock_bench import STAGES, DockWorkload, run_dock_bench
from entrepot.cli.app import app
from entrepot.dock import GRPODock


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_workload_moves_every_row_through_every_stage(layout: str) -> None:
    workload = DockWorkload(prompts=6, n_samples=4, prompt_length=8, response_length=16, dispatch_size=8,
                            iterations=3, layout=layout)  # fmt: skip
    dock = GRPODock(prompts_num=workload.prompts, n_samples_per_prompt=workload.n_samples)
    done: list[int] = []
    result = run_dock_bench(workload, dock, done.append)
    assert done == [1, 2, 3]
    assert set(result.stages) == {"put_prompts", *(stage[0] for stage in STAGES)}
    for name, stats in result.stages.items():
        assert stats.rows == 3 * 24, name
    assert result.stages["actor_rollout"].calls == 3 * 3  # 24 rows in gets of 8
    assert result.bytes_stored > 0
    assert dock.progress("actor_train") == {"consumed": 0, "live": 0}  # cleared after every iteration


def test_cli_prints_the_stage_table(runner: CliRunner) -> None:
    result = runner.invoke(
        app,
        ["dock", "bench", "--prompts", "4", "--n-samples", "2", "--iterations", "2", "--dispatch-size", "4"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "compute_advantage" in result.stdout
    assert "dock time per iteration" in result.stdout


def test_cli_rejects_a_dispatch_size_that_splits_groups(runner: CliRunner) -> None:
    result = runner.invoke(app, ["dock", "bench", "--dispatch-size", "12", "--n-samples", "8"])
    assert result.exit_code == 2
    assert "--dispatch-size (12) must be a multiple of --n-samples (8)" in result.stderr
