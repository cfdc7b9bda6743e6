"""The loss family and LoRA on the embedded default: steps and seconds to accuracy 0.9, and LoRA's costs.

Part 1 trains the default task (reverse 8 digits, 32 prompts x 8) with each policy loss for seeds 0-2,
with four optimiser steps per GRPO step (`algorithm.mini_batch_size=64`) so the later mini-batches are
off-policy and the losses' ratios and clips act (with one step per batch every surrogate's gradient is
-A grad log p). The baseline is PPO-clip in the same setting; Dr. GRPO is PPO-clip with centred
advantages and `seq-mean-token-sum-norm`.

Part 2 compares LoRA (packages/cli/configs/lora.yaml's settings) with full training, same model and
seed: seconds per step, trainable parameters, Adam state bytes, update-phase peak bytes, bytes sent to
the rollout engine per step (merged weights: the whole model, as full training), steps to 0.9.

    python packages/grpo/benchmarks/bench_losses.py [--seeds 0 1 2] [--max-steps 400] [--out DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

COMMON = ["resources.use_ray=false", "logging.tensorboard=false", "checkpoint.save_every=0", "eval.every=10"]
OFF_POLICY = ["algorithm.mini_batch_size=64"]
LOSSES: dict[str, list[str]] = {
    "ppo_clip (baseline)": ["algorithm.loss=ppo_clip"],
    "gspo": [
        "algorithm.loss=gspo",
        "algorithm.loss_agg=seq-mean-token-mean",
        "algorithm.clip_low=3e-4",
        "algorithm.clip_high=4e-4",
    ],
    "cispo": ["algorithm.loss=cispo", "algorithm.clip_low=0.2", "algorithm.clip_high=2.0"],
    "dr_grpo": [
        "algorithm.loss=ppo_clip",
        "algorithm.normalize_std=false",
        "algorithm.loss_agg=seq-mean-token-sum-norm",
    ],
}
LORA = ["model.lora.rank=8", "model.lora.alpha=16", "model.lora.target_modules=[c_attn,c_proj,c_fc]",
        "model.lora.modules_to_save=[wte,wpe,ln_f]", "algorithm.lr=2e-3"]  # fmt: skip


def _run(overrides: list[str], out: Path, target: float) -> dict[str, Any]:
    """Train until `target` accuracy (or max_steps); steps and wall seconds to it, median step time."""
    from entrepot.grpo import load_config, train

    config = load_config(None, [*COMMON, *overrides, f"eval.target_accuracy={target}"])
    result = train(config, out)  # stops at the first evaluation at or above `target`
    hit = next((h["step"] for h in result.history if h.get("accuracy", 0.0) >= target), None)
    steps = [h["time/step"] for h in result.history if "time/step" in h]
    return {
        "steps": hit,
        "seconds": result.wall_time_s if hit is not None else None,
        "step_s": statistics.median(steps) if steps else float("nan"),
        "history": result.history,
    }


def _adam_bytes(overrides: list[str]) -> tuple[int, int, int]:
    """(trainable parameters, Adam state bytes after one update, bytes of the merged model sent per sync)."""
    from entrepot.grpo import load_config
    from entrepot.grpo.algo.sequences import ResponseBatch
    from entrepot.grpo.algo.update import UpdateInputs
    from entrepot.grpo.engines.policy import build_policy

    policy = build_policy(load_config(None, [*COMMON, *overrides, "algorithm.kl_coef=0"]))
    trainer: Any = policy.trainer
    gen = torch.Generator().manual_seed(0)
    prompts, responses = (
        torch.randint(2, 12, (18,), generator=gen),
        torch.randint(2, 12, (16,), generator=gen),
    )
    batch = ResponseBatch.from_packed(prompts, torch.tensor([9, 9]), responses, torch.tensor([8, 8]))
    trainer.update(UpdateInputs(batch, torch.tensor([1.0, -1.0]), None, None, [torch.arange(2)]))
    state = trainer.torch_optimizer.state_dict()["state"].values()
    adam = sum(t.numel() * t.element_size() for s in state for t in s.values() if torch.is_tensor(t))
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    sync = sum(
        t.numel() * t.element_size() for t in policy.manager.train_engine.named_train_parameters().values()
    )
    return trainable, adam, sync


def _fmt(value: float | None, spec: str) -> str:
    return "not reached" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=["losses", "lora"], default=None, help="run one part")
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-losses-"))
    load = os.getloadavg()[0]
    print(f"load {load:.1f} on {os.cpu_count()} cores; seeds {args.seeds}; target accuracy {args.target}")
    print(f"\n{'loss':22} {'steps to target (per seed)':>30} {'s to target (mean)':>19} {'step s':>8}")
    for name, overrides in LOSSES.items() if args.only != "lora" else ():
        runs = [_run([*overrides, *OFF_POLICY, f"seed={seed}", f"max_steps={args.max_steps}"],
                     out / f"{name.split()[0]}-{seed}", args.target) for seed in args.seeds]  # fmt: skip
        steps = " ".join(_fmt(r["steps"], "d") for r in runs)
        seconds = [r["seconds"] for r in runs if r["seconds"] is not None]
        mean_s = statistics.mean(seconds) if len(seconds) == len(runs) else None
        step_s = statistics.median(r["step_s"] for r in runs)
        print(f"{name:22} {steps:>30} {_fmt(mean_s, '.1f'):>19} {step_s:8.3f}")

    if args.only == "losses":
        return
    print(f"\n{'policy':8} {'trainable':>10} {'Adam bytes':>11} {'sync bytes':>11} {'update peak':>12} "
          f"{'step s':>7} {'steps to target':>16}")  # fmt: skip
    rows = {}
    for name, overrides in (("full", []), ("lora", LORA)):
        trainable, adam, sync = _adam_bytes(overrides)
        run = _run([*overrides, "seed=0", f"max_steps={args.max_steps}"], out / f"{name}-0", args.target)
        peak = max(h.get("memory/update_peak_bytes", 0.0) for h in run["history"])
        rows[name] = (trainable, adam, run["step_s"])
        print(f"{name:8} {trainable:10d} {adam:11d} {sync:11d} {peak:12.0f} {run['step_s']:7.3f} "
              f"{_fmt(run['steps'], 'd'):>16}")  # fmt: skip
    (full_p, full_adam, full_s), (lora_p, lora_adam, lora_s) = rows["full"], rows["lora"]
    print(f"lora / full: trainable {lora_p / full_p:.2f}x, Adam state {lora_adam / full_adam:.2f}x, "
          f"seconds per step {lora_s / full_s:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
