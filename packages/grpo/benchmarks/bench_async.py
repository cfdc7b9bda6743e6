"""Synchronous against asynchronous training (`trainer.mode`), same run, same machine, load printed.

Two workloads, each run both ways in this process (the embedded policy, reverse 8 digits):

| workload  | what                                                                                  |
|-----------|---------------------------------------------------------------------------------------|
| default   | the embedded default until greedy accuracy 0.9 (evaluated every `--eval-every` steps) |
| long tail | geometric response lengths (mean `--mean-length`, cap `--max-new-tokens`), learning   |
|           | rate 1e-6 so they stay so (as `bench_partial_rollout.py`), `--steps` steps            |

A synchronous step waits for its longest response, then trains; asynchronous training decodes beside
the update with `trainer.rollout_slots` responses in flight (by default every response the staleness
bound allows: two steps' worth), refilled every `trainer.chunk_tokens` tokens, and trains the oldest
finished groups. Printed per run: trained tokens per second, reward per
trained response, the process's core utilisation (CPU seconds / wall seconds / cores), the staleness
histogram (trained tokens by policy-version age) and the rollout's and trainer's idle fractions;
then async / sync ratios. On the default workload also steps and seconds to accuracy 0.9.

    python packages/grpo/benchmarks/bench_async.py [--steps 24] [--warmup 6] [--workload both]
        [--chunk-tokens 16,64,128] [--rollout-slots 128]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_partial_rollout import _long_tail

_COMMON = ["resources.use_ray=false", "checkpoint.save_every=0", "logging.tensorboard=false",
           "logging.samples_every=0"]  # fmt: skip


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}), {len(os.sched_getaffinity(0))} cores"


def run(overrides: list[str], steps: int, *, long_tail: float | None = None,
        until: float | None = None) -> tuple[list[dict[str, Any]], list[float], list[float]]:  # fmt: skip
    """Steps of one run: their metrics, wall seconds and process CPU seconds at the end of each."""
    from entrepot.grpo import load_config
    from entrepot.grpo.trainer import Trainer

    config = load_config(None, [*_COMMON, f"max_steps={steps}", *overrides])
    rows: list[dict[str, Any]] = []
    walls: list[float] = []
    cpus: list[float] = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, run_dir)
        try:
            if long_tail is not None:
                _long_tail(trainer, long_tail)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                rows.append(trainer.train_step())
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                if until is not None and rows[-1].get("accuracy", 0.0) >= until:
                    break
        finally:
            trainer.close()
    return rows, walls, cpus


def summary(rows: list[dict[str, Any]], walls: list[float], cpus: list[float], warmup: int) -> dict[str, Any]:
    """Figures over the steps after `warmup`."""
    first = max(warmup - 1, 0)
    wall = walls[-1] - (walls[first] if warmup else 0.0)
    cpu = cpus[-1] - (cpus[first] if warmup else 0.0)
    window = rows[warmup:]
    tokens = sum(r.get("train_tokens", 0.0) for r in window)
    responses = sum(r.get("train_responses", 0.0) for r in window) or None
    ages: dict[int, float] = {}
    for r in window:
        for key, value in r.items():
            if key.startswith("async/tokens_age_"):
                age = int(key.rsplit("_", 1)[1])
                ages[age] = ages.get(age, 0.0) + value
    waits = sum(r.get("async/trainer_wait_s", 0.0) for r in window)
    return {
        "tokens_per_s": tokens / wall,
        "reward": sum(r["reward_mean"] for r in window) / len(window),
        "responses": responses,
        "cores": cpu / wall / len(os.sched_getaffinity(0)),
        "ages": ages,
        "rollout_idle": sum(r.get("async/rollout_idle_frac", 0.0) for r in window) / len(window),
        "trainer_idle": waits / wall,
        "wall": wall,
    }


def _table(title: str, results: dict[str, dict[str, Any]]) -> None:
    print(title)
    print(f"{'mode':18} {'trained tok/s':>14} {'reward/resp':>12} {'core util':>10} {'rollout idle':>13} "
          f"{'trainer idle':>13}  staleness (trained tokens by version age)")  # fmt: skip
    for mode, s in results.items():
        total = sum(s["ages"].values()) or 1.0
        ages = ", ".join(f"{a}: {100 * v / total:.0f}%" for a, v in sorted(s["ages"].items())) or "-"
        print(f"{mode:18} {s['tokens_per_s']:14.0f} {s['reward']:12.3f} {100 * s['cores']:9.0f}% "
              f"{100 * s['rollout_idle']:12.0f}% {100 * s['trainer_idle']:12.0f}%  {ages}")  # fmt: skip
    base = results["sync"]["tokens_per_s"]
    for mode, s in results.items():
        if mode != "sync":
            print(f"{mode} / sync trained tokens per second: {s['tokens_per_s'] / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=["default", "long-tail", "both"], default="both")
    parser.add_argument("--steps", type=int, default=24, help="long tail: steps per run")
    parser.add_argument("--warmup", type=int, default=6, help="long tail: steps left out of the figures")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--mean-length", type=float, default=48.0)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--chunk-tokens", default="64",
                        help="long tail: trainer.chunk_tokens per async run, comma-separated")  # fmt: skip
    parser.add_argument("--rollout-slots", type=int, default=None, help="trainer.rollout_slots")
    parser.add_argument("--max-steps", type=int, default=300, help="default: give up after this many")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--max-staleness", type=int, default=1)
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    modes = {"sync": ["trainer.mode=sync"],
             "async": ["trainer.mode=async", f"trainer.max_staleness={args.max_staleness}"]}  # fmt: skip
    print(f"bench_async: {_load()} at the start")
    if args.workload in ("long-tail", "both"):
        long_tail = [
            "eval.every=0", "algorithm.lr=1e-6", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"model.max_positions={args.max_new_tokens + 16}", f"rollout.prompts_per_step={args.prompts}",
            *([f"trainer.rollout_slots={args.rollout_slots}"] if args.rollout_slots else []),
        ]  # fmt: skip
        runs = {"sync": modes["sync"]}
        for chunk in args.chunk_tokens.split(","):
            runs[f"async (chunk {chunk})"] = [*modes["async"], f"trainer.chunk_tokens={chunk}"]
        results = {}
        for mode, overrides in runs.items():
            rows, walls, cpus = run([*long_tail, *overrides], args.steps, long_tail=args.mean_length)
            results[mode] = summary(rows, walls, cpus, args.warmup)
        _table(f"long tail: geometric lengths, mean {args.mean_length:g}, cap {args.max_new_tokens}; "
               f"{args.prompts} prompts x 8 a step; steps {args.warmup + 1}-{args.steps}; {_load()}",
               results)  # fmt: skip
    if args.workload in ("default", "both"):
        results, reached = {}, {}
        for mode, overrides in modes.items():
            rows, walls, cpus = run([f"eval.every={args.eval_every}", *overrides], args.max_steps, until=0.9)
            results[mode] = summary(rows, walls, cpus, 0)
            hit = rows[-1].get("accuracy", 0.0) >= 0.9
            reached[mode] = (len(rows) if hit else None, walls[-1] if hit else None)
        _table(f"default task until greedy accuracy 0.9 (evaluated every {args.eval_every} steps); {_load()}",
               results)  # fmt: skip
        for mode, (steps, seconds) in reached.items():
            where = f"step {steps}, {seconds:.1f} s" if steps else f"not within {args.max_steps} steps"
            print(f"{mode:6} accuracy 0.9 at {where}")
        s, a = reached["sync"][0], reached["async"][0]
        if s and a:
            print(f"async / sync steps to accuracy 0.9: {a / s:.2f}x (goal <= 1.10x)")


if __name__ == "__main__":
    main()
