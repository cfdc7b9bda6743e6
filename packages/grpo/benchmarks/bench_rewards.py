"""The rewards under bad programs and a hung judge, and the trainer's wait for them (issue 54).

Three measurements in one process, load printed at the start and the end:

| part       | what                                                                                    |
|------------|-----------------------------------------------------------------------------------------|
| code_tests | `--rollouts` responses through the verifier's batch path (`CodeTests.judge`, the one      |
|            | `score_batch` takes) with `reward.code.timeout_s` = `--code-timeout`: `--loop-fraction`   |
|            | of the programs loop forever, the rest pass or fail their tests. Goals: every sample      |
|            | scored and counted, each within the deadline + 1 s; the batch's wall time against the     |
|            | same batch without the looping programs (the baseline)                                    |
| judge      | the same number of rows through `LocalJudge.judge` in batches of `--judge-batch`, on a    |
|            | tiny random Qwen2 (the tests' `tiny_judge_dir`) whose engine is a planted subclass of the |
|            | real one: it answers "Score: 7", and sleeps `--judge-hang` s on `--hang-fraction` of the  |
|            | rows (one generate call per row). Goal: each batch within `timeout_s` + 1 s              |
| trainer    | `--steps` steps of packages/cli/configs/code-tests.yaml in-process (`api.train`, no eval,  |
|            | no checkpoint): ``time/reward`` / ``time/step`` per step. Goal: < 10%                      |

    python packages/grpo/benchmarks/bench_rewards.py [--rollouts 1000] [--steps 4]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads
os.environ.setdefault("OMP_NUM_THREADS", "1")  # slow a tiny model down on shared cores

import argparse
import collections
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "packages" / "grpo" / "tests"))  # tiny_judge_dir: a judge written here

# One function task (as data.task code_functions writes them) in three programs: right, wrong, a loop.
_TESTS = '["assert add_7(1) == 8", "assert add_7(-7) == 0", "assert add_7(10) == 17"]'
_PROGRAMS = {
    "pass": "def add_7(x):\n    return x + 7\n",
    "fail": "def add_7(x):\n    return x + 6\n",
    "loop": "def add_7(x):\n    while True:\n        pass\n",
}


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip() + f" ({len(os.sched_getaffinity(0))} cores)"


def _kinds(num: int, loop_fraction: float, seed: int) -> list[str]:
    """`num` program kinds in a seeded shuffle: round(loop_fraction * num) loops, the rest half pass,
    half fail."""
    num_loops = round(loop_fraction * num)
    rest = num - num_loops
    kinds = ["loop"] * num_loops + ["pass"] * (rest - rest // 2) + ["fail"] * (rest // 2)
    random.Random(seed).shuffle(kinds)
    return kinds


def _code_batch(kinds: Sequence[str], timeout_s: float, max_workers: int) -> tuple[float, list[Any]]:
    """Wall seconds and results of one batch through the code_tests verifier."""
    from entrepot.grpo.config import CodeRewardConfig
    from entrepot.grpo.data.code_tests import CodeTests

    verifier = CodeTests()
    verifier.configure(CodeRewardConfig(timeout_s=timeout_s, max_workers=max_workers))
    responses = [f"Here it is:\n```python\n{_PROGRAMS[k]}```\n" for k in kinds]
    t0 = time.perf_counter()
    results = verifier.judge(responses, [_TESTS] * len(kinds))
    return time.perf_counter() - t0, results


def bench_code(args: argparse.Namespace) -> bool:
    """The code_tests table; True when every goal holds."""
    from entrepot.grpo.data.code_tests import verdict_metrics

    kinds = _kinds(args.rollouts, args.loop_fraction, args.seed)
    wall, results = _code_batch(kinds, args.code_timeout, args.max_workers)
    clean = [k for k in kinds if k != "loop"]
    base_wall, base_results = _code_batch(clean, args.code_timeout, args.max_workers)
    counts = {k.removeprefix("reward/code_"): int(v) for k, v in verdict_metrics(results).items()}
    table = collections.Counter((k, r.verdict.value) for k, r in zip(kinds, results, strict=True))
    limit = args.code_timeout + 1.0
    slowest = max(r.seconds for r in results)
    late = sum(r.seconds > limit for r in results)
    expected = {"pass": "pass", "fail": "fail", "loop": "timeout"}
    right = sum(n for (k, v), n in table.items() if expected[k] == v)
    print(
        f"\n## code_tests: {len(kinds)} rollouts, {kinds.count('loop')} loop forever, timeout_s "
        f"{args.code_timeout}, max_workers {args.max_workers}, isolated "
        f"{counts['isolated']}/{len(results)}"
    )
    print("\n| program | samples | " + " | ".join(expected.values()) + " | crash | memory | syntax |")
    print("|---|---:|" + "---:|" * 6)
    verdicts = ["pass", "fail", "timeout", "crash", "memory", "syntax"]
    for kind in expected:
        cells = " | ".join(str(table.get((kind, v), 0)) for v in verdicts)
        print(f"| {kind} | {kinds.count(kind)} | {cells} |")
    total = " | ".join(str(counts[v]) for v in verdicts)
    print(f"| **counted** (`reward/code_*`) | {sum(counts[v] for v in verdicts)} | {total} |")
    print("\n| batch | samples | wall s | slowest sample s | samples past deadline + 1 s |")
    print("|---|---:|---:|---:|---:|")
    print(f"| with the loops | {len(kinds)} | {wall:.2f} | {slowest:.2f} | {late} |")
    base_slowest = max((r.seconds for r in base_results), default=0.0)
    print(
        f"| without them (baseline) | {len(clean)} | {base_wall:.2f} | {base_slowest:.2f} | "
        f"{sum(r.seconds > limit for r in base_results)} |"
    )
    print(
        f"\nratio with / without: {wall / base_wall:.2f}x (+{wall - base_wall:.2f} s for "
        f"{kinds.count('loop')} loops over {args.max_workers} workers: "
        f"{kinds.count('loop') * args.code_timeout / args.max_workers:.2f} s of deadlines)"
    )
    scored = len(results) == len(kinds) and sum(counts[v] for v in verdicts) == len(kinds)
    ok = scored and late == 0 and right == len(kinds)
    print(
        f"goals: every sample scored and counted {'yes' if scored else 'NO'}; verdicts as planted "
        f"{right}/{len(kinds)}; every sample within deadline + 1 s {'yes' if late == 0 else 'NO'}"
    )
    return ok


def _planted_judge(judge_dir: Path, timeout_s: float, hang_s: float) -> Any:
    """A `LocalJudge` on the tiny judge's weights whose engine (a real subclass of the Llama-family
    one) answers "Score: 7" per row, sleeping `hang_s` first on a rubric whose response says HANG."""
    import torch

    from entrepot.grpo.config import JudgeConfig
    from entrepot.grpo.engines.base import Rollout
    from entrepot.grpo.engines.judge import LocalJudge
    from entrepot.grpo.engines.models import load_pretrained
    from entrepot.grpo.engines.rollout_llama import LlamaRolloutEngine

    model, tokenizer = load_pretrained(judge_dir, key="reward.judge.model_path")

    class Planted(LlamaRolloutEngine):
        def generate(self, prompts: Sequence[Any], params: Any, **kwargs: Any) -> Rollout:
            if any("HANG" in tokenizer.decode(list(p)) for p in prompts):
                time.sleep(hang_s)  # a hung generate: the judge cannot interrupt it
            rows = [tokenizer("Score: 7")["input_ids"] for _ in prompts]
            return Rollout.from_rows(rows, [torch.zeros(len(r)) for r in rows])

    engine = Planted.reading(model.requires_grad_(False).eval())
    config = JudgeConfig(model_path=str(judge_dir), timeout_s=timeout_s, micro_batch=1, cache_size=0)
    return LocalJudge(config, tokenizer, engine)


def bench_judge(args: argparse.Namespace, judge_dir: Path) -> bool:
    """The judge table; True when every batch ends within timeout_s + 1 s."""
    rng = random.Random(args.seed)
    hangs = set(rng.sample(range(args.rollouts), round(args.hang_fraction * args.rollouts)))
    responses = [("HANG " if i in hangs else "") + f"response {i}" for i in range(args.rollouts)]
    judge = _planted_judge(judge_dir, args.judge_timeout, args.judge_hang)
    rows: list[tuple[str, int, dict[str, int], float, float, int]] = []
    baseline = [r for r in responses if not r.startswith("HANG")]
    for name, rows_in in (("with the hangs", responses), ("without them (baseline)", baseline)):
        counts: collections.Counter[str] = collections.Counter()
        walls, abandoned, lost = [], 0, []
        for start in range(0, len(rows_in), args.judge_batch):
            batch = rows_in[start : start + args.judge_batch]
            t0 = time.perf_counter()
            judged, metrics = judge.judge(["Write add_7."] * len(batch), batch, ["x + 7"] * len(batch))
            walls.append(time.perf_counter() - t0)
            counts.update(j.verdict.value for j in judged)
            abandoned += int(metrics["reward/judge_abandoned"])
            hung = sum(r.startswith("HANG") for r in batch)
            if hung or metrics["reward/judge_timeout"]:
                lost.append(
                    f"batch {start // args.judge_batch}: {hung} hung, "
                    f"{int(metrics['reward/judge_timeout'])} timeout in {walls[-1]:.2f} s"
                )
        rows.append((name, len(rows_in), dict(counts), sum(walls), max(walls), abandoned))
        if lost:
            print(f"{name}: " + "; ".join(lost))
        time.sleep(args.judge_hang)  # the last abandoned thread ends before the baseline
    print(
        f"\n## judge: {args.rollouts} rows in batches of {args.judge_batch} (one generate call per row), "
        f"{len(hangs)} calls hang {args.judge_hang} s, timeout_s {args.judge_timeout}"
    )
    print("\n| batches | rows | ok | timeout | other | abandoned threads | wall s | slowest batch s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, num, counts, total, slowest, abandoned in rows:
        other = num - counts.get("ok", 0) - counts.get("timeout", 0)
        print(
            f"| {name} | {num} | {counts.get('ok', 0)} | {counts.get('timeout', 0)} | {other} | "
            f"{abandoned} | {total:.2f} | {slowest:.2f} |"
        )
    within = rows[0][4] <= args.judge_timeout + 1.0
    judged_all = sum(rows[0][2].values()) == rows[0][1]
    print(
        f"goals: every row judged or timed out {'yes' if judged_all else 'NO'}; "
        f"every batch within timeout_s + 1 s {'yes' if within else 'NO'} (slowest {rows[0][4]:.2f} s)"
    )
    return within


def bench_trainer(args: argparse.Namespace) -> bool:
    """time/reward as a fraction of time/step over `--steps` steps of code-tests.yaml; True when < 10%."""
    from entrepot.grpo import load_config
    from entrepot.grpo.api import train

    overrides = [f"max_steps={args.steps}", "eval.every=0", "checkpoint.save_every=0",
                 "logging.tensorboard=false", "logging.samples_every=0"]  # fmt: skip
    config = load_config(str(ROOT / "packages" / "cli" / "configs" / "code-tests.yaml"), overrides)
    with tempfile.TemporaryDirectory() as tmp:
        result = train(config, Path(tmp) / "run")
    print(
        f"\n## trainer: {result.steps} steps of code-tests.yaml ({config.rollout.prompts_per_step} x "
        f"{config.rollout.n_samples_per_prompt} responses, reward.code.timeout_s "
        f"{config.reward.code.timeout_s}, "
        f"max_workers {config.reward.code.max_workers})"
    )
    print("\n| step | time/step s | time/reward s | reward / step | generate s | update s | code verdicts |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    fractions = []
    for row in result.history:
        step, reward = row["time/step"], row["time/reward"]
        fractions.append(reward / step)
        counted = {
            k.removeprefix("reward/code_"): int(v) for k, v in row.items() if k.startswith("reward/code_")
        }
        verdicts = ", ".join(f"{k} {v}" for k, v in counted.items() if v and k != "isolated")
        print(
            f"| {row['step']} | {step:.2f} | {reward:.3f} | {reward / step:.1%} | "
            f"{row.get('time/generate', 0.0):.2f} | {row.get('time/update', 0.0):.2f} | {verdicts} |"
        )
    mean = sum(fractions) / len(fractions)
    print(
        f"goal: time/reward < 10% of the step: {'yes' if max(fractions) < 0.1 else 'NO'} "
        f"(mean {mean:.1%}, worst {max(fractions):.1%})"
    )
    return max(fractions) < 0.1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64, help="responses scored (the issue: 1000)")
    parser.add_argument("--loop-fraction", type=float, default=0.05)
    parser.add_argument("--code-timeout", type=float, default=1.0, help="reward.code.timeout_s")
    parser.add_argument("--max-workers", type=int, default=4, help="reward.code.max_workers")
    parser.add_argument("--hang-fraction", type=float, default=0.02)
    parser.add_argument("--judge-timeout", type=float, default=1.0, help="reward.judge.timeout_s")
    parser.add_argument("--judge-hang", type=float, default=2.0, help="seconds a hung generate sleeps")
    parser.add_argument("--judge-batch", type=int, default=32, help="rows per judge batch (a step's)")
    parser.add_argument("--steps", type=int, default=2, help="training steps of code-tests.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", choices=["code", "judge", "trainer"], action="append", default=[])
    args = parser.parse_args(argv)
    from tests_support_models import tiny_judge_dir

    print(f"load at start: {_loadavg()}")
    t0 = time.perf_counter()
    goals = {}
    if "code" not in args.skip:
        goals["code_tests"] = bench_code(args)
    if "judge" not in args.skip:
        with tempfile.TemporaryDirectory() as tmp:
            goals["judge"] = bench_judge(args, tiny_judge_dir(Path(tmp) / "judge"))
    if "trainer" not in args.skip:
        goals["trainer"] = bench_trainer(args)
    print(
        f"\nload at end: {_loadavg()}; whole benchmark {time.perf_counter() - t0:.1f} s; "
        f"threads left {threading.active_count()}"
    )
    print("goals met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in goals.items()))


if __name__ == "__main__":
    main()
