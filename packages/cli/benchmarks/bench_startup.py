"""Start-up time of `rl --help` next to a bare interpreter and an eager CLI, measured in one run.

The CLI keeps torch, Ray and the entrepot libraries out of its module imports so that `--help`,
completion and config errors answer at once. This script measures how much that is worth:
a bare `python -c pass` (the floor), `rl --help` (ours), and the imports an eager CLI would pay
before parsing anything (`entrepot.grpo.api`'s dependencies: torch, ray, transformers, the dock).

    python packages/cli/benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_MAIN = "from entrepot.cli.app import main; main()"
_EAGER = "import torch, ray, transformers, entrepot.dock, entrepot.grpo.trainer"
_MAIN = "from entrepot.cli.app import main; main()"
_EAGER = "import torch, ray, transformers, entrepot.dock, entrepot.grpo.trainer"
CASES = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "rl --help (ours)": [sys.executable, "-c", _MAIN, "--help"],
    "rl grpo config show (ours)": [sys.executable, "-c", _MAIN, "grpo", "config", "show"],
    "eager imports (torch, ray, transformers, dock)": [sys.executable, "-c", _EAGER],
}


def _median_seconds(command: list[str], repeats: int) -> float:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, capture_output=True, env=env)  # warm the file-system cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {name: _median_seconds(command, args.repeats) for name, command in CASES.items()}
    ours = results["rl --help (ours)"]
    print(f"start-up, median of {args.repeats} runs (lower is better)")
    print(f"{'case':<48} {'seconds':>8} {'x rl --help':>12}")
    for name, seconds in results.items():
        print(f"{name:<48} {seconds:>8.3f} {seconds / ours:>12.2f}")


if __name__ == "__main__":
    main()
