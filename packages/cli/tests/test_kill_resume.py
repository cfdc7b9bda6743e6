"""Kill `rl grpo train` anywhere (SIGKILL, mid-step and mid-checkpoint), resume, and nothing is trained twice.

One run is killed and resumed over and over until it finishes; it must end with exactly the
prompts, metrics and weights of a run that was never interrupted (resume is bit-exact; of the
metrics, every key but the measured ones: seconds, rates, memory peaks). A
second Ctrl-C, which lands in the middle of a step, must leave a run that resumes the same way.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests_support_rl import rl, rl_command, rl_env

from entrepot.grpo.run.metrics import is_measured, read_metrics

pytestmark = pytest.mark.integration  # `rl grpo train` processes, killed and resumed

# In-process workers (no Ray processes to orphan on SIGKILL), a checkpoint every step.
FAST = [
    "resources.use_ray=false",
    "rollout.prompts_per_step=8",
    "rollout.n_samples_per_prompt=4",
    "eval.every=0",
    "eval.num_prompts=16",
    "checkpoint.save_every=1",
    "checkpoint.keep_last=2",
    "logging.tensorboard=false",
]
MAX_STEPS = 60
KILLS = 10


def _records(run_dir: Path) -> list[tuple[int, int]]:
    """(step, prompts drawn by then) of every metrics line: the prompts each step trained on."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["data/prompts_drawn"]) for r in map(json.loads, filter(None, lines))]


def _start(args: list[str]) -> subprocess.Popen[str]:
    command = rl_command("grpo", "train", "--quiet", *args)
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=rl_env()
    )


def _kill_at(process: subprocess.Popen[str], run_dir: Path, mid_checkpoint: bool, rng: random.Random) -> str:
    """SIGKILL `process` once it trains: when it writes a checkpoint, or a random moment in a step."""
    metrics = run_dir / "metrics.jsonl"
    steps_before = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if mid_checkpoint:
            if any((run_dir / "checkpoints").glob("*.tmp")):
                break
            time.sleep(0.0005)
        elif metrics.exists() and len(metrics.read_text().splitlines()) > steps_before:
            time.sleep(rng.uniform(0.0, 0.25))
            while any((run_dir / "checkpoints").glob("*.tmp")) and process.poll() is None:
                time.sleep(0.0005)  # this kill is meant for a step: let a checkpoint being written finish
            break
        else:
            time.sleep(0.01)
    if process.poll() is not None:
        return "finished"
    process.kill()
    process.wait(30)
    return "mid-checkpoint" if any((run_dir / "checkpoints").glob("*.tmp")) else "mid-step"


def kill_and_resume_until_done(
    first: subprocess.Popen[str], run_dir: Path, kills: int, rng: random.Random
) -> list[str]:
    """Kill `first`, then resume and kill again (alternately mid-step and mid-checkpoint) until `kills`
    kills landed, then resume to the end; each attempt's outcome (`_kill_at`)."""
    outcomes = [_kill_at(first, run_dir, mid_checkpoint=False, rng=rng)]
    while len([o for o in outcomes if o != "finished"]) < kills and outcomes[-1] != "finished":
        resumed = _start(["--resume", str(run_dir)])
        outcomes.append(_kill_at(resumed, run_dir, mid_checkpoint=len(outcomes) % 2 == 1, rng=rng))
    if outcomes[-1] != "finished":
        done = rl("grpo", "train", "--resume", str(run_dir), "--quiet")
        assert done.returncode == 0, done.stdout
    return outcomes


def test_killed_anywhere_and_resumed_trains_every_prompt_once(tmp_path: Path) -> None:
    # the uninterrupted reference trains alongside the killed run (one thread each; resume is bit-exact)
    reference = _start(["-o", str(tmp_path / "ref"), "--name", "ref", "--max-steps", str(MAX_STEPS),
                        "--seed", "3", *FAST])  # fmt: skip
    out = tmp_path / "killed"
    first = _start(["-o", str(out), "--name", "killed", "--max-steps", str(MAX_STEPS), "--seed", "3", *FAST])
    deadline = time.monotonic() + 120
    while not list(out.glob("*/checkpoints/step_000001/state.json")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first kill comes after one checkpoint exists, so there is one to resume
    run_dir = next(out.iterdir())
    outcomes = kill_and_resume_until_done(first, run_dir, KILLS, random.Random(0))
    reference_output, _ = reference.communicate(timeout=240)
    assert reference.returncode == 0, reference_output
    ref_dir = next((tmp_path / "ref").iterdir())
    kills = [o for o in outcomes if o != "finished"]
    print(f"kills: {len(kills)} ({kills.count('mid-step')} mid-step, {kills.count('mid-checkpoint')} "
          f"mid-checkpoint); steps {MAX_STEPS}")  # fmt: skip
    assert len(kills) >= KILLS and kills.count("mid-checkpoint") >= 2 and kills.count("mid-step") >= 2

    assert _records(run_dir) == _records(ref_dir)  # every step once, each on the same prompts
    computed = [
        [{k: v for k, v in r.items() if not is_measured(k)} for r in read_metrics(run / "metrics.jsonl")]
        for run in (run_dir, ref_dir)
    ]
    assert computed[0] == computed[1]  # the same metrics at every step, the dock's rows included
    final = f"checkpoints/step_{MAX_STEPS:06d}/model.safetensors"
    assert (run_dir / final).read_bytes() == (ref_dir / final).read_bytes()


def test_a_second_ctrl_c_mid_step_leaves_a_run_that_resumes(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    slower = ["rollout.prompts_per_step=32", "rollout.n_samples_per_prompt=8"]  # steps of ~0.3 s
    process = _start(["-o", str(out), "--max-steps", "200", *FAST, *slower])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("*/checkpoints/step_000002/state.json")):
        time.sleep(0.05)
    time.sleep(0.1)  # into step 3
    for _ in range(2):  # the second Ctrl-C interrupts the step in progress
        os.kill(process.pid, signal.SIGINT)
        time.sleep(0.05)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "Traceback" not in output
    run_dir = next(out.iterdir())
    done_before = _records(run_dir)[-1][0]
    target = done_before + 2
    resumed = rl("grpo", "train", "--resume", str(run_dir), f"max_steps={target}", "--quiet")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    records = _records(run_dir)
    assert [step for step, _ in records] == list(range(1, target + 1))
    assert [drawn for _, drawn in records] == [32 * step for step, _ in records]  # no prompt skipped


def test_a_mid_step_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(
    tmp_path: Path,
) -> None:
    """Two Ctrl-C 20 ms apart land in one step unless a step ends between them (then it is saved)."""
    slower = ["rollout.prompts_per_step=32", "rollout.n_samples_per_prompt=8", "checkpoint.save_every=100"]
    outcomes = []
    for attempt in range(3):
        out = tmp_path / f"runs{attempt}"
        process = _start(["-o", str(out), "--max-steps", "200", *FAST, *slower])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(p.stat().st_size for p in out.glob("*/metrics.jsonl")):
            time.sleep(0.05)
        time.sleep(0.1)
        for _ in range(2):
            os.kill(process.pid, signal.SIGINT)
            time.sleep(0.02)  # signals sent closer together are merged into one by the kernel
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 130, output
        # a whole checkpoint (a second Ctrl-C inside the save leaves only step_*.tmp, not resumable)
        saved = any(not p.name.endswith(".tmp") for p in out.glob("*/checkpoints/step_*"))
        said = " ".join(output.split())
        assert ("resume with: rl grpo train --resume" in said) == saved, output
        assert ("interrupted before the first checkpoint: there is nothing to resume" in said) != saved, (
            output
        )
        outcomes.append(saved)
        if not saved:
            break
    assert outcomes[-1] is False, "every attempt's Ctrl-C pair straddled a step boundary"
