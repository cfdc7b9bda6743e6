"""Time to first step of `rl grpo train` on its embedded default, by start-up phase: Ray vs one process.

Each run is a real `rl grpo train -q max_steps=1` process. Its start-up lines are timestamped as
they arrive, and the first step ends when metrics.jsonl gets its first line. Phases:

    CLI          command start -> the first start-up line (Python, the CLI, config and input checks)
    (trainer)    the split the trainer prints in "started in X s (...)": Ray and imports (overlapped),
                 the dock, the workers until ready (or, in one process, the imports and the build)
    step 1       "started in" -> the first metrics line

plus how busy the machine's cores were from command start to the first step (/proc/stat): near
100% means start-up is bound by CPU work, not by waiting.

Runs alternate between the two settings so that machine load hits both alike; the table gives the
median of each phase and the ratio of the Ray run's time to first step to the one-process run's.
`python -c "import torch"`, timed in the same run, says how fast the machine was (on this shared
machine it varied 1.3-2.5 s between hours, and start-up with it).

    python packages/cli/benchmarks/bench_first_step.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_CLI = "from entrepot.cli.app import main; main()"
_STARTED = re.compile(r"started in ([\d.]+) s \((.*)\)")
SETTINGS = {"Ray (resources.use_ray=true)": ["resources.use_ray=true"], "one process (the default)": []}


def _busy_cpu_seconds() -> float:
    """CPU-seconds this machine's cores have spent busy since boot (Linux /proc/stat; 0 elsewhere)."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return 0.0
    ticks = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def _first_step(overrides: list[str]) -> dict[str, float]:
    """One `rl grpo train` run: seconds from command start to each phase (and the trainer's split)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-c", _CLI, "grpo", "train", "-q", "-o", out, "max_steps=1",
                   "eval.every=0", "checkpoint.save_every=0", *overrides]  # fmt: skip
        start, busy = time.perf_counter(), _busy_cpu_seconds()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(
            target=lambda: lines.extend((time.perf_counter(), x) for x in proc.stdout or [])
        )
        reader.start()
        step_done = None
        while proc.poll() is None and step_done is None:
            if any(p.stat().st_size for p in Path(out).glob("*/metrics.jsonl")):
                step_done = time.perf_counter() - start
                busy = _busy_cpu_seconds() - busy
            time.sleep(0.02)
        proc.wait()
        reader.join()
        if proc.returncode != 0 or step_done is None:
            raise SystemExit(f"{command} failed:\n" + "".join(text for _, text in lines))
    times = {"starting": 0.0, "started": 0.0}
    for at, text in lines:
        if text.startswith(("starting ", "loading ")) and not times["starting"]:
            times["starting"] = at - start
        if (found := _STARTED.search(text)) is not None:
            times["started"] = at - start
            for phase in found.group(2).split(", "):
                name, seconds = phase.rsplit(" ", 2)[0], float(phase.rsplit(" ", 2)[1])
                times[name] = seconds
    times["first step"] = step_done
    times["cpu busy"] = busy / (step_done * len(os.sched_getaffinity(0)))  # of every core, until step 1
    return times


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, overrides in SETTINGS.items():
            runs[name].append(_first_step(overrides))
    print(f"rl grpo train (embedded default): seconds per start-up phase, median of {args.repeats} runs")
    first: dict[str, float] = {}
    for name, records in runs.items():
        med = {key: statistics.median(r.get(key, 0.0) for r in records) for key in records[0]}
        first[name] = med["first step"]
        phases = {"CLI": med["starting"]}
        skip = ("starting", "started", "first step", "cpu busy")
        phases.update({k: v for k, v in med.items() if k not in skip})
        phases["step 1"] = med["first step"] - med["started"]
        print(f"  {name}: first step at {med['first step']:.1f} s = " + " + ".join(
            f"{phase} {seconds:.1f}" for phase, seconds in phases.items())
            + f"; cores {med['cpu busy']:.0%} busy until then")  # fmt: skip
    torch_import = statistics.median(_seconds([sys.executable, "-c", "import torch"]) for _ in range(3))
    print(f"  machine speed: python -c 'import torch' {torch_import:.1f} s (median of 3)")
    ray, local = (first[name] for name in SETTINGS)
    print(f"time to first step, Ray / one process: {ray / local:.2f}x (target: Ray <= 15 s, idle machine)")


if __name__ == "__main__":
    main()
