"""Multi-turn rollouts: concurrent against sequential environment calls, and the calculator task's curve.

Part 1 (same run, same workload): `MultiTurnRollout.run` over the embedded engine of the calculator
policy (`packages/cli/configs/calculator.yaml`'s model, random weights from the seed, `CharChat` over
the multi-turn alphabet), `--prompts` addition prompts x `--samples`, each trajectory with an
environment whose `step` sleeps `--env-delay-ms` and answers a fixed short message, done after
`--turns` turns. Two settings of ``multiturn.env_concurrency``:

| setting    | environment calls                                                              |
|------------|--------------------------------------------------------------------------------|
| sequential | env_concurrency 1: one call at a time (the baseline)                           |
| concurrent | env_concurrency `--concurrency` (64): every trajectory's call in flight at once |

Each is run `--repeats` times, interleaved, with the sampling stream reseeded the same way; printed
per setting: medians of wall seconds, generated tokens per second and trajectories per second, and
how the wall time splits (the runner's ``time/multiturn_generate`` and ``time/multiturn_env_wait``);
then concurrent / sequential ratios. The sequential floor is trajectories x turns x delay.

Part 2 (`--skip-train` leaves it out): trains `calculator.yaml` (`entrepot.grpo.api.train`) for its
max_steps (`--steps` overrides) and prints every 5th step's reward_mean, train_accuracy,
env/tool_calls, greedy eval accuracy (when evaluated) and wall seconds since the start.

    python packages/grpo/benchmarks/bench_multiturn.py [--concurrency 64] [--repeats 3]
        [--env-delay-ms 50] [--turns 3] [--prompts 8] [--samples 8] [--steps 60] [--skip-train]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

CALCULATOR = Path(__file__).resolve().parents[2] / "cli" / "configs" / "calculator.yaml"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}), {len(os.sched_getaffinity(0))} cores"


class SleepEnv:
    """An environment whose every `step` sleeps `delay_s` (a slow tool or judge) and answers "0";
    done after `turns` model turns, reward 1 then."""

    def __init__(self, delay_s: float = 0.05, turns: int = 3) -> None:
        self.delay_s, self.turns, self.steps = delay_s, turns, 0

    def reset(self, row: Any) -> None:
        self.steps = 0

    def step(self, action: str) -> Any:
        from entrepot.grpo.multiturn.environment import Step

        time.sleep(self.delay_s)
        self.steps += 1
        if self.steps >= self.turns:
            return Step(reward=1.0, done=True)
        return Step(observation="0")


def _rollout_setup(args: argparse.Namespace) -> dict[str, Any]:
    """The calculator policy's embedded engine with its initial weights, the chat format and the starts."""
    from entrepot.grpo import load_config
    from entrepot.grpo.data.sources import encode_prompt
    from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
    from entrepot.grpo.engines.base import SamplingParams
    from entrepot.grpo.engines.policy import initial_model
    from entrepot.grpo.engines.rollout_embedded import build_embedded_engine
    from entrepot.grpo.multiturn.chat import CharChat
    from entrepot.grpo.multiturn.environment import Row

    budget = args.turns * args.max_new_tokens + (args.turns - 1) * 4  # model turns + "<eos>>0=" messages
    config = load_config(str(CALCULATOR), [f"seed={args.seed}", f"model.max_positions={budget + 24}"])
    model, setup = initial_model(config)
    engine = build_embedded_engine(config.engine, model, lanes=1)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    tok = setup.tokenizer
    samples = setup.source.batch(0, args.prompts)
    starts = [
        (Row(s.prompt, s.answer, i * args.samples + k), encode_prompt(setup, s.prompt, 32))
        for i, s in enumerate(samples)
        for k in range(args.samples)
    ]
    return {
        "engine": engine, "chat": CharChat(tok), "starts": starts, "pad": tok.pad_token_id, "budget": budget,
        "sampling": SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=(tok.eos_token_id,)),
    }  # fmt: skip


def rollout_once(args: argparse.Namespace, setup: dict[str, Any], concurrency: int) -> dict[str, float]:
    """One `MultiTurnRollout.run` of every start with `concurrency` environment threads."""
    from entrepot.grpo.config.multiturn import MultiTurnConfig
    from entrepot.grpo.multiturn.runner import MultiTurnRollout

    env_args = {"delay_s": args.env_delay_ms / 1000, "turns": args.turns}
    config = MultiTurnConfig(
        environment="bench_multiturn:SleepEnv", env_args=env_args, max_turns=args.turns,
        max_tokens=setup["budget"], max_observation_tokens=8, env_concurrency=concurrency,
    )  # fmt: skip
    runner = MultiTurnRollout(config, setup["chat"], SleepEnv)
    try:
        generator = torch.Generator().manual_seed(args.seed + 7919)
        t0 = time.perf_counter()
        trajectories, metrics = runner.run(setup["engine"], setup["starts"], setup["sampling"],
                                           pad_token_id=setup["pad"], generator=generator)  # fmt: skip
        wall = time.perf_counter() - t0
    finally:
        runner.close()
    done = sum(t.end.label == "done" for t in trajectories)
    return {
        "wall": wall,
        "tokens": metrics["rollout_tokens"],
        "tokens_per_s": metrics["rollout_tokens"] / wall,
        "trajectories_per_s": len(trajectories) / wall,
        "generate": metrics["time/multiturn_generate"],
        "env_wait": metrics["time/multiturn_env_wait"],
        "turns": metrics["multiturn/turns_mean"],
        "done": float(done),
    }


def part_concurrency(args: argparse.Namespace) -> None:
    setup = _rollout_setup(args)
    n = len(setup["starts"])
    runs = {"sequential": 1, "concurrent": args.concurrency}
    for _ in range(args.warmup):
        rollout_once(args, setup, args.concurrency)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so a change of machine load hits both settings
        for name, concurrency in runs.items():
            results[name].append(rollout_once(args, setup, concurrency))
    floor = n * args.turns * args.env_delay_ms / 1000
    print(f"part 1: {args.prompts} prompts x {args.samples} = {n} trajectories, {args.turns} turns, step() "
          f"sleeps {args.env_delay_ms:g} ms, <= {args.max_new_tokens} tokens a model turn; medians of "
          f"{args.repeats} runs each; sequential floor {floor:.1f} s; {_load()}")  # fmt: skip
    print(f"{'setting':25} {'wall s':>8} {'gen tok/s':>10} {'traj/s':>8} {'gen tokens':>11} "
          f"{'generate s':>11} {'env wait s':>11} {'other s':>8} {'turns':>6} {'done':>5}")  # fmt: skip
    medians: dict[str, dict[str, float]] = {}
    for name, rows in results.items():
        m = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        medians[name] = m
        other = m["wall"] - m["generate"] - m["env_wait"]
        label = f"{name} (env_conc {runs[name]})"
        print(f"{label:25} {m['wall']:8.3f} {m['tokens_per_s']:10.0f} {m['trajectories_per_s']:8.1f} "
              f"{m['tokens']:11.0f} {m['generate']:11.3f} {m['env_wait']:11.3f} {other:8.3f} "
              f"{m['turns']:6.2f} {m['done']:5.0f}")  # fmt: skip
    for name, rows in results.items():
        walls = ", ".join(f"{r['wall']:.3f}" for r in rows)
        print(f"  {name} wall seconds per run: {walls}")
    s, c = medians["sequential"], medians["concurrent"]
    print(f"concurrent / sequential: wall {c['wall'] / s['wall']:.3f}x, generated tokens per second "
          f"{c['tokens_per_s'] / s['tokens_per_s']:.1f}x, trajectories per second "
          f"{c['trajectories_per_s'] / s['trajectories_per_s']:.1f}x")  # fmt: skip


def part_train(args: argparse.Namespace) -> None:
    from entrepot.grpo import load_config
    from entrepot.grpo.api import train

    overrides = [f"seed={args.seed}", *([f"max_steps={args.steps}"] if args.steps else [])]
    config = load_config(str(CALCULATOR), overrides)
    rows: list[tuple[float, dict[str, Any]]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = train(config, Path(tmp) / "run", started_at=t0,
                       on_step=lambda m: rows.append((time.perf_counter() - t0, m)))  # fmt: skip
    print(f"part 2: {CALCULATOR.name}, {config.max_steps} steps ({config.rollout.prompts_per_step} prompts x "
          f"{config.rollout.n_samples_per_prompt}, eval every {config.eval.every} on "
          f"{config.eval.num_prompts} prompts, greedy); {_load()}")  # fmt: skip
    print(f"{'step':>5} {'reward_mean':>12} {'train_acc':>10} {'tool_calls':>11} {'eval acc':>9} "
          f"{'wall s':>8}")  # fmt: skip
    for wall, m in rows:
        step = int(m["step"])
        if step % 5 and step != len(rows):
            continue
        acc = f"{m['accuracy']:9.3f}" if "accuracy" in m else f"{'-':>9}"
        print(f"{step:5d} {m['reward_mean']:12.3f} {m.get('train_accuracy', 0.0):10.3f} "
              f"{m.get('env/tool_calls', 0.0):11.3f} {acc} {wall:8.1f}")  # fmt: skip
    print(f"part 2: {result.steps} steps in {result.wall_time_s:.1f} s (start-up included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=64, help="env_concurrency of the concurrent runs")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (medians reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed concurrent runs first")
    parser.add_argument("--env-delay-ms", type=float, default=50.0, help="seconds each step() sleeps, in ms")
    parser.add_argument("--turns", type=int, default=3, help="model turns per trajectory")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="trajectories per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens a model turn may take")
    parser.add_argument("--steps", type=int, default=None, help="part 2: steps (default: the config's)")
    parser.add_argument("--skip-train", action="store_true", help="leave part 2 out")
    parser.add_argument("--seed", type=int, default=0)
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(f"bench_multiturn: {_load()} at the start")
    part_concurrency(args)
    if not args.skip_train:
        part_train(args)


if __name__ == "__main__":
    main()
