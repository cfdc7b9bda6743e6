"""Advantage estimators and on-policy distillation on the embedded default: steps and seconds to 0.9.

Every run trains the default task (`rl grpo train`'s embedded config: reverse 8 digits, ~100k-param
GPT-2, 32 prompts x 8) in this process, evaluating greedy accuracy every `--eval-every` steps and
stopping at the first evaluation at or above the target (`eval.target_accuracy`). The baseline is
`algorithm.advantage=grpo`; against it, same seed: rloo, reinforce_pp, reinforce_pp_baseline, and
on-policy distillation (`algorithm.distill`, docs/distillation.md) from a teacher this script first
trains with GRPO (seed `--teacher-seed`) to accuracy 1.0 or `--teacher-steps`, whichever comes first;
its run directory is the teacher, the student a fresh model. Distillation runs go on to the teacher's
accuracy (the goal: reach it in at most 50% of GRPO's steps to it), so GRPO does too.
PPO + GAE (a learned value function) is not built: its row says so.

    python packages/grpo/benchmarks/bench_algorithms.py               # seed 0: ~3 minutes on 2 idle cores
    python packages/grpo/benchmarks/bench_algorithms.py --seeds 0 1 2 [--reward-weights 0 0.5]
    python packages/grpo/benchmarks/bench_algorithms.py --teacher D/teacher --estimators --reward-weights 0.5
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

COMMON = ["resources.use_ray=false", "logging.tensorboard=false", "checkpoint.save_every=0"]
ESTIMATORS = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")


def _run(overrides: list[str], out: Path, target: float) -> dict[str, Any]:
    """Train until `target` (or max_steps): the history with each step's seconds since the start."""
    from entrepot.grpo import load_config, train

    config = load_config(None, [*COMMON, *overrides, f"eval.target_accuracy={target}"])
    start = time.perf_counter()
    history: list[dict[str, Any]] = []

    def on_step(metrics: dict[str, Any]) -> None:
        history.append({**metrics, "elapsed": time.perf_counter() - start})  # start-up and evals included

    result = train(config, out, on_step=on_step)
    steps = [h["time/step"] for h in history if "time/step" in h]
    return {"history": history, "step_s": statistics.median(steps), "run_dir": result.run_dir}


def _first(history: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((h for h in history if h.get("accuracy", 0.0) >= target), None)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or not den else f"{num / den:.2f}x"


def _print_table(
    rows: dict[tuple[str, int], dict[str, Any]], names: list[str], seeds: list[int], target: float,
    high: float, max_steps: int,
) -> None:  # fmt: skip
    """The table (each method against GRPO of the same seed) and the distillation goal, met or not."""
    head = [f"steps to {target}", f"s to {target}", "s/step", "steps vs grpo", "s/step vs grpo"]
    print(f"\n{'estimator':24} {'seed':>4} {head[0]:>12} {head[1]:>9} {head[2]:>7} {head[3]:>14} "
          f"{head[4]:>15} {f'steps to {high:.3f}':>15}")  # fmt: skip
    for seed in seeds:
        base = rows.get(("grpo", seed), {"steps": None, "step_s": None})  # `--estimators` without grpo
        for name in names:
            r = rows[name, seed]
            print(f"{name:24} {seed:4d} {_fmt(r['steps'], 'd'):>12} {_fmt(r['seconds'], '.1f'):>9} "
                  f"{r['step_s']:7.3f} {_ratio(r['steps'], base['steps']):>14} "
                  f"{_ratio(r['step_s'], base['step_s']):>15} {_fmt(r['steps_high'], 'd'):>15}")  # fmt: skip
        print(f"{'ppo + gae':24} {seed:4d} {'not built':>12}")
    print(f"\ngoal: distillation reaches the teacher's accuracy ({high:.3f}) in <= 50% of GRPO's steps to it")
    for name in (m for m in names if m.startswith("distill")):
        for seed in seeds:
            if ("grpo", seed) not in rows:
                continue
            d, g = rows[name, seed]["steps_high"], rows["grpo", seed]["steps_high"]
            bound = 0.5 * (g if g is not None else max_steps)  # GRPO short of it: > max_steps
            met = "met" if d is not None and d <= bound else "not met"
            print(f"  {name} seed {seed}: {_fmt(d, 'd')} vs GRPO {_fmt(g, 'd')} ({_ratio(d, g)}): {met}")


def _teacher(args: argparse.Namespace, out: Path) -> tuple[Path, float]:
    """The teacher's run directory and its last evaluation's accuracy (that of its final checkpoint)."""
    if args.teacher is not None:
        lines = (args.teacher / "metrics.jsonl").read_text().splitlines()
        accuracy = [json.loads(line)["accuracy"] for line in lines if '"accuracy"' in line][-1]
        print(f"teacher: {args.teacher} (trained before), accuracy {accuracy:.3f}")
        return args.teacher, accuracy
    teacher = _run(["algorithm.advantage=grpo", f"seed={args.teacher_seed}", f"eval.every={args.eval_every}",
                    f"max_steps={args.teacher_steps}"], out / "teacher", 1.0)  # fmt: skip
    evals = [h for h in teacher["history"] if "accuracy" in h]
    accuracy, last = evals[-1]["accuracy"], teacher["history"][-1]  # the checkpoint is saved at the end
    print(f"teacher: GRPO seed {args.teacher_seed}, accuracy {accuracy:.3f} at step {last['step']} "
          f"({last['elapsed']:.1f} s), {teacher['run_dir']}")  # fmt: skip
    return teacher["run_dir"], accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--teacher-steps", type=int, default=400)
    parser.add_argument("--teacher-seed", type=int, default=100)
    parser.add_argument("--reward-weights", type=float, nargs="+", default=[0.0],
                        help="algorithm.distill.reward_weight values to run")  # fmt: skip
    parser.add_argument("--estimators", nargs="*", choices=ESTIMATORS, default=list(ESTIMATORS),
                        help="advantages to run (grpo: the ratios' baseline)")  # fmt: skip
    parser.add_argument("--teacher", type=Path, default=None,
                        help="a teacher run trained before (an --out's teacher/)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-algorithms-"))
    every = [f"eval.every={args.eval_every}", f"max_steps={args.max_steps}"]
    load_start = Path("/proc/loadavg").read_text().strip()
    print(f"/proc/loadavg at start: {load_start} ({os.cpu_count()} cores); seeds {args.seeds}")

    teacher_dir, teacher_acc = _teacher(args, out)
    high = max(args.target, teacher_acc)

    methods: dict[str, list[str]] = {name: [f"algorithm.advantage={name}"] for name in args.estimators}
    for weight in args.reward_weights:
        methods[f"distill rw={weight:g}"] = [
            "algorithm.advantage=grpo",
            f"algorithm.distill.teacher={teacher_dir}",
            f"algorithm.distill.reward_weight={weight}",
        ]
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in args.seeds:
        for name, overrides in methods.items():
            # GRPO and distillation go on to the teacher's accuracy (the goal compares them there)
            target = high if name == "grpo" or name.startswith("distill") else args.target
            run = _run([*overrides, *every, f"seed={seed}"], out / f"{name.replace(' ', '_')}-{seed}", target)
            hit, top = _first(run["history"], args.target), _first(run["history"], high)
            rows[name, seed] = {
                "steps": hit and hit["step"], "seconds": hit and hit["elapsed"], "step_s": run["step_s"],
                "steps_high": top and top["step"],
            }  # fmt: skip
            print(f"  {name} seed {seed}: steps to {args.target} {_fmt(rows[name, seed]['steps'], 'd')}, "
                  f"to {high:.3f} {_fmt(rows[name, seed]['steps_high'], 'd')}", flush=True)  # fmt: skip

    _print_table(rows, list(methods), args.seeds, args.target, high, args.max_steps)
    print(f"/proc/loadavg at end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
