"""Agent endpoint under load: the `openai` client against the policy served on loopback, vs in-process.

One run, one engine, one task: the calculator policy's embedded engine (`packages/cli/configs/
calculator.yaml`'s model, random weights from the seed, `CharChat` over the multi-turn alphabet),
`--sessions` addition prompts, each an episode of exactly `--turns` model turns of at most
`--max-new-tokens` tokens; after each model turn the other side answers "0" (``>0=`` in the
character chat format) at once, so the figures are the serving path's, not a tool's.

| setting    | who drives the episodes                                                             |
|------------|-------------------------------------------------------------------------------------|
| in-process | `MultiTurnRollout.run` with an environment answering "0" (env_concurrency = sessions) |
| endpoint   | `AgentRollout.run`: an agent per session, all in flight, each turn one                |
|            | `AsyncOpenAI.chat.completions.create` over HTTP to the `AgentServer`                  |

Each setting is run `--repeats` times, interleaved, after `--warmup` untimed runs of each. Printed:
for the endpoint, p50 / p99 request latency over every request of the timed runs; for both, median
wall seconds and generated tokens per second, and how the engine was used (calls of
`RolloutEngine.generate`, mean prompts a call, seconds inside it: the rest of the wall is HTTP, JSON,
sessions and scheduling); then the endpoint / in-process ratio of tokens per second against the goal
of 0.8x, and /proc/loadavg at the start and the end. `--profile` adds one run of each setting that prints
the CPU seconds of each thread (for the endpoint: the agents' loop, the server's loop, the request
workers) next to the seconds inside the engine.

    python packages/grpo/benchmarks/bench_agents.py [--sessions 32] [--turns 3] [--repeats 3]
        [--warmup 1] [--max-new-tokens 6] [--seed 0] [--profile]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # made a tiny model 5-10x slower on 2 shared cores

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

CALCULATOR = Path(__file__).resolve().parents[2] / "cli" / "configs" / "calculator.yaml"
GOAL = 0.8  # endpoint tokens/s at least this fraction of the in-process runner's
REPLY = "0"  # what the environment and the agent answer after every model turn


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


class TimedEngine:
    """The rollout engine, counting its `generate` calls, their prompts and seconds (the profile)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls, self.prompts, self.seconds = 0, 0, 0.0

    def reset(self) -> None:
        self.calls, self.prompts, self.seconds = 0, 0, 0.0

    def generate(self, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.engine.generate(prompts, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            self.prompts += len(prompts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class ReplyEnv:
    """Answers `REPLY` after every model turn; done (reward 1) after `turns` turns."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.steps = turns, 0

    def reset(self, row: Any) -> None:
        self.steps = 0

    def step(self, action: str) -> Any:
        from entrepot.grpo.multiturn.environment import Step

        self.steps += 1
        if self.steps >= self.turns:
            return Step(reward=1.0, done=True)
        return Step(observation=REPLY)


def fixed_turns_agent(turns: int, latencies: list[float]) -> Any:
    """An agent of exactly `turns` chat completions, answering `REPLY` as a tool after each; every
    request's latency (seconds, as the client sees it) goes to `latencies`."""

    async def agent(client: Any, row: dict[str, Any]) -> float:
        messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
        for turn in range(turns):
            t0 = time.perf_counter()
            reply = await client.chat.completions.create(model="policy", messages=messages)
            latencies.append(time.perf_counter() - t0)
            if turn + 1 < turns:
                messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
                messages.append({"role": "tool", "tool_call_id": "reply", "content": REPLY})
        return 1.0

    return agent


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    """The calculator policy's embedded engine (timed), chat format, starts, sampling and config."""
    from entrepot.grpo import load_config
    from entrepot.grpo.config.multiturn import MultiTurnConfig
    from entrepot.grpo.data.sources import encode_prompt
    from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
    from entrepot.grpo.engines.base import SamplingParams
    from entrepot.grpo.engines.policy import initial_model
    from entrepot.grpo.engines.rollout_embedded import build_embedded_engine
    from entrepot.grpo.multiturn.chat import CharChat
    from entrepot.grpo.multiturn.environment import Row

    # every model turn, and a "<eos>>0=" message after each but the last: no limit ends an episode early
    budget = args.turns * args.max_new_tokens + (args.turns - 1) * (len(REPLY) + 3)
    config = load_config(str(CALCULATOR), [f"seed={args.seed}", f"model.max_positions={budget + 24}"])
    model, setup = initial_model(config)
    engine = build_embedded_engine(config.engine, model, lanes=1)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    tok = setup.tokenizer
    samples = setup.source.batch(0, args.sessions)
    starts = [(Row(s.prompt, s.answer, i), encode_prompt(setup, s.prompt, 32)) for i, s in enumerate(samples)]
    multiturn = MultiTurnConfig(
        environment="bench_agents:ReplyEnv", env_args={"turns": args.turns}, max_turns=args.turns,
        max_tokens=budget, max_observation_tokens=8, env_concurrency=args.sessions,
    )  # fmt: skip
    agent_config = MultiTurnConfig(
        agent="bench_agents:fixed_turns_agent", max_turns=args.turns, max_tokens=budget,
        max_observation_tokens=8, agent_concurrency=args.sessions, agent_timeout_s=120,
    )  # fmt: skip
    return {
        "engine": TimedEngine(engine), "chat": CharChat(tok), "tokenizer": tok, "starts": starts,
        "pad": tok.pad_token_id, "multiturn": multiturn, "agent_config": agent_config,
        "sampling": SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=(tok.eos_token_id,)),
    }  # fmt: skip


def _run(rollout: Any, setup: dict[str, Any], seed: int) -> dict[str, float]:
    engine = setup["engine"]
    engine.reset()
    generator = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    trajectories, metrics = rollout.run(engine, setup["starts"], setup["sampling"],
                                        pad_token_id=setup["pad"], generator=generator)  # fmt: skip
    wall = time.perf_counter() - t0
    turns = sum(t.turns for t in trajectories)
    if turns != len(trajectories) * setup["multiturn"].max_turns:
        ends = sorted({t.end.label for t in trajectories})
        raise RuntimeError(f"{turns} model turns, not sessions x turns (ends: {ends})")
    return {
        "wall": wall, "tokens": metrics["rollout_tokens"], "tokens_per_s": metrics["rollout_tokens"] / wall,
        "calls": float(engine.calls), "per_call": engine.prompts / max(engine.calls, 1),
        "generate": engine.seconds,
    }  # fmt: skip


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, summed by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # the thread ended since the listing
            continue
        name = names.get(int(task.name), "other (native)")
        name = "AnyIO worker thread" if name.startswith("AnyIO worker") else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


ROLES = {
    "MainThread": "the rollout's caller: the runner, or the agents' asyncio loop (openai + httpx + pydantic)",
    "entrepot-agent-server": "the server's loop: uvicorn HTTP, FastAPI routing, JSON responses",
    "AnyIO worker thread": "request workers: parse, render, sessions, the batched engine generate",
}


def profile(name: str, rollout: Any, setup: dict[str, Any], seed: int) -> None:
    """One more run of `name`: CPU seconds by thread against the seconds inside the engine, to tell
    the HTTP/JSON cost from the batching of concurrent requests."""
    before = _thread_cpu()
    row = _run(rollout, setup, seed)
    after = _thread_cpu()
    spent = {n: after[n] - before.get(n, 0.0) for n in after}
    print(f"profile, one {name} run: wall {row['wall']:.3f} s, {row['calls']:.0f} engine calls of "
          f"{row['per_call']:.1f} prompts, {row['generate']:.3f} s inside them; CPU s by thread "
          f"({sum(spent.values()):.3f} in all):")  # fmt: skip
    for thread in sorted(spent, key=lambda n: -spent[n]):
        if spent[thread] >= 0.005:
            print(f"  {thread:24} {spent[thread]:7.3f}  {ROLES.get(thread, '')}")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=32, help="concurrent sessions (episodes)")
    parser.add_argument("--turns", type=int, default=3, help="model turns per session")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting (medians)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per setting first")
    parser.add_argument("--max-new-tokens", type=int, default=6, help="tokens a model turn may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="one more run each: CPU by thread")
    args, _ = parser.parse_known_args()  # the bench-grpo session passes its posargs to every script
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(f"bench_agents: /proc/loadavg at the start: {_loadavg()}")
    from entrepot.grpo.agents.rollout import AgentRollout
    from entrepot.grpo.multiturn.runner import MultiTurnRollout

    setup = _setup(args)
    latencies: list[float] = []
    rollouts = {
        "in-process": MultiTurnRollout(setup["multiturn"], setup["chat"], ReplyEnv),
        "endpoint": AgentRollout(setup["agent_config"], setup["chat"], setup["tokenizer"],
                                 fixed_turns_agent(args.turns, latencies)),
    }  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {name: [] for name in rollouts}
    try:
        for k in range(args.warmup + args.repeats):  # interleaved: a change of load hits both settings
            if k == args.warmup:
                latencies.clear()
            for name, rollout in rollouts.items():
                row = _run(rollout, setup, args.seed + k)
                if k >= args.warmup:
                    results[name].append(row)
        timed_latencies = list(latencies)
        if args.profile:
            for name, rollout in rollouts.items():
                profile(name, rollout, setup, args.seed)
    finally:
        for rollout in rollouts.values():
            rollout.close()
    print(f"{args.sessions} sessions x {args.turns} turns (<= {args.max_new_tokens} tokens a turn), the "
          f"calculator policy's embedded engine, {args.warmup} warm-up + {args.repeats} timed runs each "
          f"(medians), {os.environ['OMP_NUM_THREADS']} torch thread(s)")  # fmt: skip
    print(f"{'setting':11} {'wall s':>8} {'gen tok/s':>10} {'gen tokens':>11} {'engine calls':>13} "
          f"{'prompts/call':>13} {'in engine s':>12} {'outside s':>10}")  # fmt: skip
    medians = {}
    for name, rows in results.items():
        m = medians[name] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(f"{name:11} {m['wall']:8.3f} {m['tokens_per_s']:10.0f} {m['tokens']:11.0f} {m['calls']:13.0f} "
              f"{m['per_call']:13.1f} {m['generate']:12.3f} {m['wall'] - m['generate']:10.3f}")  # fmt: skip
    for name, rows in results.items():
        walls = ", ".join(f"{r['wall']:.3f}" for r in rows)
        print(f"  {name} wall seconds per run: {walls}")
    p50, p99 = (1000 * _quantile(timed_latencies, q) for q in (0.5, 0.99))
    count = len(timed_latencies)
    print(f"endpoint request latency over {count} requests: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    ratio = medians["endpoint"]["tokens_per_s"] / medians["in-process"]["tokens_per_s"]
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"endpoint / in-process generated tokens per second: {ratio:.2f}x (goal >= {GOAL}x: {verdict})")
    print(f"bench_agents: /proc/loadavg at the end: {_loadavg()}")


if __name__ == "__main__":
    main()
