"""Real `rl grpo train` processes (dock, resharding and all) on a shrunken default config.

A short run (the default: one process) must finish and leave metrics.jsonl, the plot and a
checkpoint, which `rl grpo eval` reads. A second run, on Ray, is stopped with Ctrl-C (SIGINT to the
whole process group, as a terminal sends it): it must save a checkpoint and exit 130, and `--resume`
must continue it step for step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests_support_rl import metric_steps, rl, rl_command, rl_env

pytestmark = pytest.mark.integration  # `rl grpo train` processes, one on Ray

# Small enough for a shared 2-core machine, big enough that every stage runs (KL > 0: reference too).
SMALL = [
    "rollout.prompts_per_step=8",
    "rollout.n_samples_per_prompt=4",
    "eval.every=2",
    "eval.num_prompts=32",
    "checkpoint.save_every=2",
    "logging.tensorboard=false",
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("runs")
    done = rl("grpo", "train", "-o", str(out), "--name", "short", "--max-steps", "4", "--seed", "1", *SMALL)
    runs = list(out.iterdir())
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(runs) == 1 and runs[0].name.startswith("short-")
    return runs[0], done


def test_train_writes_config_metrics_plot_and_checkpoint(
    finished_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run_dir, done = finished_run
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "checkpoints" / "step_000004" / "model.safetensors").is_file()
    assert "max_steps: 4" in (run_dir / "config.yaml").read_text()
    assert "GRPO run summary" in done.stdout
    # start-up as it happens; one worker per role and no cluster: one process (resources.use_ray: null)
    assert "starting 1 actor rank(s) + 1 reward worker(s) in this process" in done.stdout
    assert "started in " in done.stdout
    assert "start-up (this invocation)" in done.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["time/startup"] > 0 and all("time/startup" not in r for r in records[1:])
    assert all("reward_mean" in r and "kl" in r for r in records)
    assert "accuracy" in records[1] and "accuracy" in records[3]  # eval.every=2


def test_eval_reads_the_checkpoint(finished_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, _ = finished_run
    done = rl("grpo", "eval", str(run_dir), "--num-prompts", "16")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "greedy" in done.stdout
    evaluated = next(line for line in done.stdout.splitlines() if line.startswith("evaluated: "))
    assert evaluated.startswith(f"evaluated: {run_dir}")  # the path whole, on one line
    held_out = next(line for line in done.stdout.splitlines() if " prompts " in line)
    assert "16" in held_out.split(), held_out
    default = rl("grpo", "eval", str(run_dir))  # no --num-prompts: the run's eval.num_prompts (SMALL)
    assert default.returncode == 0, default.stdout + default.stderr
    held_out = next(line for line in default.stdout.splitlines() if " prompts " in line)
    assert "32" in held_out.split(), held_out


def test_a_model_path_that_is_no_model_exits_2_at_once_and_leaves_no_run_folder(tmp_path: Path) -> None:
    started = time.perf_counter()
    done = rl("grpo", "train", "-q", "-o", str(tmp_path / "runs"), f"model.path={tmp_path}", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: model.path ({str(tmp_path)!r}) must be a local HF model directory with config.json"
    ]
    assert not (tmp_path / "runs").exists()
    assert time.perf_counter() - started < 60  # refused before Ray starts (it used to take 41-58 s)


def test_a_crashing_verifier_is_one_line_with_its_traceback_in_error_log(tmp_path: Path) -> None:
    (tmp_path / "my_rewards.py").write_text("def crash(response, answer):\n    raise ValueError('no')\n")
    verifier = ["reward.custom={crash: 'my_rewards:crash'}", "reward.verifiers={crash: 1.0}"]
    env = {**rl_env(), "PYTHONPATH": str(tmp_path)}  # the local Ray's workers inherit it
    command = rl_command("grpo", "train", "-q", "-o", str(tmp_path / "runs"), *SMALL, *verifier)
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: stage 'rule_reward' failed in reward rank 0 on rows [0, 1, 2, 3, 4, 5, 6, 7, ...] (32 rows): "
        "ValueError: no"
    ]
    (run_dir,) = (tmp_path / "runs").iterdir()
    log = (run_dir / "error.log").read_text()
    assert 'my_rewards.py", line 2, in crash' in log and log.rstrip().endswith("ValueError: no")
    assert f"the worker's traceback: {run_dir / 'error.log'}" in done.stdout


def test_bad_yaml_key_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("algorithm:\n  kl_coeff: 0.1\n")
    done = rl("grpo", "train", "--config", str(config), "-o", str(tmp_path / "runs"), timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: unknown key 'algorithm.kl_coeff' (did you mean 'algorithm.kl_coef'?); allowed keys here: "
        + done.stderr.split("allowed keys here: ")[1].strip()
    ]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    process = subprocess.Popen(
        rl_command("grpo", "train", "-o", str(out), "--max-steps", "200", "--quiet", *SMALL,
                   "resources.use_ray=true"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rl_env(), start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            metrics = list(out.glob("*/metrics.jsonl"))
            if metrics and len(metrics[0].read_text().splitlines()) >= 1:
                break
            time.sleep(0.5)
        if process.poll() is not None:  # say why: its output
            early = process.communicate()[0]
            raise AssertionError(f"training ended before it could be interrupted:\n{early}")
        if time.monotonic() >= deadline:  # a Ctrl-C now would land in start-up, not in a step
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"no step within 180 s:\n{process.communicate()[0]}")
        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output
    run_dir = next(out.iterdir())
    interrupted_at = metric_steps(run_dir)[-1]
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert checkpoints and checkpoints[-1].name == f"step_{interrupted_at:06d}", output
    assert f"resume with: rl grpo train --resume {run_dir}" in " ".join(output.split())
    assert "Traceback" not in output

    target = interrupted_at + 1  # the step after the saved checkpoint, so the steps are contiguous
    done = rl("grpo", "train", "--resume", str(run_dir), f"max_steps={target}", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert metric_steps(run_dir) == list(range(1, target + 1))
    assert (run_dir / "checkpoints" / f"step_{target:06d}").is_dir()
    assert f"max_steps: {target}" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "curves.png").is_file()
    shutil.rmtree(out)
