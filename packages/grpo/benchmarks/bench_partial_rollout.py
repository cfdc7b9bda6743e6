"""Partial rollout against whole rollouts on long-tail response lengths, same run, same workload.

The embedded policy (reverse 8 digits, in this process) is given a long tail: its final layer norm is
set to a constant, so every position samples EOS with probability 1/`--mean-length` whatever the
context (a geometric length, capped at `--max-new-tokens`; learning rate 1e-6 keeps it so). Two runs:

| run      | rollout                                                                    |
|----------|----------------------------------------------------------------------------|
| full     | every response generated to its end in its step (the baseline)             |
| partial  | rollout.partial_max_tokens = `--partial` new tokens per response and step  |

A whole-rollout step waits for its longest response (the tail: ~`mean x ln(batch)` tokens); a partial
step decodes at most `--partial` tokens, with the responses of earlier steps continuing beside the new
ones, and trains the groups that finished. Printed per run, over the steps after the first
`--warmup` (partial rollout needs max_age steps to fill its pipeline): median step time, responses
trained per second and generated tokens per second; then partial / full ratios, the tokens trained per
policy-version age and the forced completions.

    python packages/grpo/benchmarks/bench_partial_rollout.py [--steps 24] [--warmup 10] [--partial 64]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import math
import statistics
import tempfile
from typing import Any

import torch


def _long_tail(trainer: Any, mean_length: float) -> None:
    """Make every position sample EOS with probability 1 / mean_length (tied head: logits = wte @ b)."""
    eos = trainer.setup.tokenizer.eos_token_id
    params = trainer.actors.workers[0].trainer.named_parameters()
    wte, ln_weight, ln_bias = (params[f"transformer.{n}"] for n in ("wte.weight", "ln_f.weight", "ln_f.bias"))
    vocab = wte.shape[0]
    p_eos = 1.0 / mean_length
    logits = torch.full((vocab,), math.log((1 - p_eos) / (vocab - 1)))
    logits[eos] = math.log(p_eos)
    with torch.no_grad():
        ln_weight.zero_()
        ln_bias.zero_()
        ln_bias[0] = 1.0
        wte[:, 0] = logits


def run(args: argparse.Namespace, partial: int | None) -> list[dict[str, Any]]:
    from entrepot.grpo import load_config
    from entrepot.grpo.trainer import Trainer

    overrides = [
        "resources.use_ray=false", "eval.every=0", "checkpoint.save_every=0", "logging.tensorboard=false",
        f"max_steps={args.steps}", "algorithm.lr=1e-6", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"model.max_positions={args.max_new_tokens + 16}", f"rollout.prompts_per_step={args.prompts}",
        "rollout.n_samples_per_prompt=8", f"seed={args.seed}",
        *([f"rollout.partial_max_tokens={partial}"] if partial else []),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(load_config(None, overrides), run_dir)
        try:
            _long_tail(trainer, args.mean_length)
            return [trainer.train_step() for _ in range(args.steps)]
        finally:
            trainer.close()


def summary(rows: list[dict[str, Any]], args: argparse.Namespace, n: int) -> dict[str, float]:
    window = rows[args.warmup :]
    seconds = sum(r["time/step"] for r in window)
    partial = "partial/groups_finished" in window[0]  # whole rollouts train every prompt drawn
    trained = sum(r["partial/groups_finished"] for r in window) if partial else len(window) * args.prompts
    return {
        "step_s": statistics.median(r["time/step"] for r in window),
        "responses_per_s": trained * n / seconds,
        "gen_tokens_per_s": sum(r["rollout_tokens"] for r in window) / seconds,
        "longest_response": max(r.get("response_length_max", 0.0) for r in window),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--partial", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--mean-length", type=float, default=48.0)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    full = run(args, None)
    part = run(args, args.partial)
    a, b = summary(full, args, 8), summary(part, args, 8)
    print(f"long tail: geometric lengths, mean {args.mean_length:g}, cap {args.max_new_tokens}; "
          f"{args.prompts} prompts x 8 per step; steps {args.warmup + 1}-{args.steps} measured")  # fmt: skip
    print(f"{'run':8} {'step s (median)':>16} {'responses/s':>12} {'gen tokens/s':>13} {'longest':>8}")
    for name, s in (("full", a), ("partial", b)):
        print(f"{name:8} {s['step_s']:16.3f} {s['responses_per_s']:12.1f} {s['gen_tokens_per_s']:13.0f} "
              f"{s['longest_response']:8.0f}")  # fmt: skip
    print(f"partial / full: step time {b['step_s'] / a['step_s']:.2f}x, "
          f"trained responses per second {b['responses_per_s'] / a['responses_per_s']:.2f}x")  # fmt: skip
    window = part[args.warmup :]
    ages: dict[str, float] = {}
    for row in window:
        for key, value in row.items():
            if key.startswith("partial/tokens_age_"):
                ages[key.rsplit("_", 1)[1]] = ages.get(key.rsplit("_", 1)[1], 0.0) + value
    total = sum(ages.values()) or 1.0
    shares = ", ".join(
        f"{age}: {100 * v / total:.0f}%" for age, v in sorted(ages.items(), key=lambda kv: int(kv[0]))
    )
    print(f"partial: trained tokens by policy-version age: {shares}")
    forced = sum(r["partial/forced_completions"] for r in window)
    in_flight = part[-1]["partial/groups_in_flight"]
    print(f"partial: forced completions {forced:.0f}; groups in flight at the end {in_flight:.0f}")


if __name__ == "__main__":
    main()
