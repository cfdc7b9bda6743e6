"""Time-to-accuracy of the embedded default: the full system vs a plain loop, torch vs megatron-core.

All runs train the same config (reverse 8 digits, ~100k-param GPT-2, 32 prompts x 8 samples,
KL 0.04 to the reference) with the same policy and update code. The plain loop (plain_loop.py, in
this folder) keeps everything in one process; the full system adds the dock and the worker groups
(actor, reward) and their calls, run twice: in one process (the default) and as Ray workers
(`resources.use_ray=true`). The ratio of their time per step to the plain loop's is the overhead of
that machinery. The third run trains with megatron-core at TP2 (two gloo ranks), resharded every step
into the TP1 rollout engine with checksums on: its time per step against the torch engine's, and
the reshard seconds / bytes / GB/s per step (`--no-megatron` skips it). `--vllm` adds the full
system with vLLM generating (`engine.rollout=vllm`, run by `nox -s bench-vllm`): its seconds per
stage next to the torch engine's, the weight load (inside reshard_to_infer) and the log-prob
mismatch between vLLM and the trainer. `--vs-trl` runs only the comparison with TRL's GRPOTrainer
instead (vs_trl.py, in this folder: `rl grpo train` and TRL timed to the target accuracy, peak memory);
`--vs-trl-smollm2` the same comparison on a real model (vs_trl_smollm2.py: SmolLM2-135M-Instruct on
word problems, s/step, rollout tokens/s, peak RSS, reward and accuracy curves; `--curve`: 30 minutes).

    python packages/grpo/benchmarks/bench_grpo.py [--max-steps 300] [--target 0.9] [--out DIR]
    python packages/grpo/benchmarks/bench_grpo.py --vs-trl [--repeats 3] [--out DIR]
    python packages/grpo/benchmarks/bench_grpo.py --vs-trl-smollm2 --model models/smollm2 [--curve]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # plain_loop.py, bench_packing.py, vs_trl.py

import vs_trl
import vs_trl_smollm2

STAGES = (
    "time/reshard_to_infer",
    "time/generate",
    "time/rollout",
    "time/reward",
    "time/ref",
    "time/advantages",
    "time/update",
    "time/old_logp",
    "time/reshard_to_train",
    "time/step",
    "reshard/seconds",
    "reshard/bytes",
    "reshard/gbps",
    "rollout/logp_mismatch_mean",
    "rollout/logp_mismatch_max",
)


def _first_at(history: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((m for m in history if m.get("accuracy", 0.0) >= target), None)


def _summary(name: str, history: list[dict[str, Any]], wall: float, target: float) -> dict[str, Any]:
    hit = _first_at(history, target)
    after = [
        m["accuracy"] for m in history if "accuracy" in m and hit is not None and m["step"] >= hit["step"]
    ]
    steady = history[5:] or history  # skip warm-up steps
    return {
        "name": name,
        "steps_to_target": hit["step"] if hit else None,
        "time_to_target_s": hit["elapsed"] if hit else None,
        "min_accuracy_after": min(after) if after else None,
        "final_accuracy": history[-1].get("accuracy"),
        "wall_s": wall,
        "steps": len(history),
        **{key: statistics.median(m[key] for m in steady if key in m) for key in STAGES if key in steady[-1]},
    }


def run_plain(config: Any) -> tuple[list[dict[str, Any]], float]:
    from plain_loop import run_plain as plain

    start = time.perf_counter()
    history = plain(config)
    return history, time.perf_counter() - start


def run_full(config: Any, run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    from entrepot.grpo import train

    start = time.perf_counter()
    history: list[dict[str, Any]] = []

    def on_step(metrics: dict[str, Any]) -> None:
        metrics["elapsed"] = time.perf_counter() - start  # includes Ray start-up and worker spawn
        history.append(metrics)

    train(config, run_dir, on_step=on_step)
    return history, time.perf_counter() - start


def _memcpy_gbps(nbytes: int, repeats: int = 20) -> float:
    """This machine's copy bound for `nbytes` (median of `repeats` fresh-destination copies), GB/s."""
    import torch

    source = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.empty_like(source).copy_(source)
        times.append(time.perf_counter() - start)
    return source.numel() * 4 / statistics.median(times) / 1e9


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=None, help="write curves.json (vs_trl.json) here")
    parser.add_argument("--no-megatron", action="store_true", help="skip the megatron-core TP2 run")
    parser.add_argument("--vllm", action="store_true", help="add a run with vLLM generating")
    parser.add_argument("--vs-trl", action="store_true", help="only the comparison with TRL (vs_trl.py)")
    parser.add_argument("--vs-trl-smollm2", action="store_true",
                        help="only the real-model comparison with TRL (vs_trl_smollm2.py)")  # fmt: skip
    vs_trl.add_arguments(parser)
    vs_trl_smollm2.add_arguments(parser)
    args, _ = parser.parse_known_args()  # nox passes every bench_*.py the same arguments
    if args.vs_trl:
        vs_trl.run(args)
        return
    if args.vs_trl_smollm2:
        vs_trl_smollm2.run(args)
        return

    import torch

    from entrepot.grpo import load_config

    torch.set_num_threads(1)
    overrides = [f"max_steps={args.max_steps}", "logging.tensorboard=false", "checkpoint.save_every=0"]
    config = load_config(None, overrides)
    runs = {"plain loop": run_plain(config)}
    with tempfile.TemporaryDirectory() as tmp:
        runs["one process"] = run_full(config, Path(tmp) / "run")  # the default (resources.use_ray: null)
        ray = load_config(None, [*overrides, "resources.use_ray=true"])
        runs["Ray workers"] = run_full(ray, Path(tmp) / "ray")
        if not args.no_megatron:
            megatron = load_config(None, [*overrides, "engine.train=megatron", "parallel.train.tensor=2"])
            runs["megatron TP2"] = run_full(megatron, Path(tmp) / "megatron")
        if args.vllm:
            runs["vLLM rollout"] = run_full(
                load_config(None, [*overrides, "engine.rollout=vllm"]), Path(tmp) / "vllm"
            )
    rows = [_summary(name, hist, wall, args.target) for name, (hist, wall) in runs.items()]

    print(f"\nGRPO default (reverse 8 digits): target greedy accuracy {args.target}, {args.max_steps} steps")
    print(
        f"{'':<14}{'steps->target':>14}{'s->target':>11}{'min acc after':>14}{'final acc':>10}{'wall s':>9}"
    )
    for r in rows:
        print(f"{r['name']:<14}{_fmt(r['steps_to_target'], 'd') if r['steps_to_target'] else '-':>14}"
              f"{_fmt(r['time_to_target_s'], '.1f'):>11}{_fmt(r['min_accuracy_after']):>14}"
              f"{_fmt(r['final_accuracy']):>10}{r['wall_s']:>9.1f}")  # fmt: skip
    print("\nmedian per step by stage (steps 6+; seconds unless named)")
    print(f"{'stage':<24}" + "".join(f"{r['name']:>15}" for r in rows))
    for key in STAGES:
        if any(r.get(key) is not None for r in rows):
            print(f"{key:<24}" + "".join(f"{_fmt(r.get(key), '.4g'):>15}" for r in rows))
    by_name = {r["name"]: r for r in rows}
    plain, local, ray = (by_name[name]["time/step"] for name in ("plain loop", "one process", "Ray workers"))
    print(f"\noverhead ratio (full system / plain loop time per step): one process {local / plain:.2f}x, "
          f"Ray workers {ray / plain:.2f}x  (target <= 1.3x)")  # fmt: skip
    if "vLLM rollout" in by_name:
        ratio = by_name["vLLM rollout"]["time/step"] / local
        print(f"vLLM / torch rollout engine time per step (both one process): {ratio:.2f}x")
    if "megatron TP2" in by_name:
        megatron = by_name["megatron TP2"]
        ratio = megatron["time/step"] / ray
        print(f"megatron TP2 / torch engine time per step (both Ray workers): {ratio:.2f}x")
        moved, gbps = int(megatron["reshard/bytes"]), megatron["reshard/gbps"]
        bound = _memcpy_gbps(moved)
        print(f"reshard: {moved / 1e6:.2f} MB per step at {gbps:.3f} GB/s; "
              f"memcpy of as many bytes here: {bound:.2f} GB/s ({gbps / bound:.1%} of it)")  # fmt: skip
    for name, (hist, _) in list(runs.items())[1:]:
        print(f"\naccuracy curve ({name}): step  elapsed_s  accuracy")
        for m in hist:
            if "accuracy" in m and (m["step"] % 20 == 0 or m is _first_at(hist, args.target)):
                print(f"  {m['step']:>4}  {m['elapsed']:>7.1f}  {m['accuracy']:.3f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        curves = {name: [{k: m.get(k) for k in ("step", "elapsed", "accuracy", "reward_mean")} for m in hist]
                  for name, (hist, _) in runs.items()}  # fmt: skip
        (args.out / "curves.json").write_text(json.dumps({"summary": rows, "curves": curves}, indent=1))


if __name__ == "__main__":
    main()
