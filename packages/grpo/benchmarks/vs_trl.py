"""Time to accuracy against TRL: `rl grpo train` (the embedded default) vs TRL's GRPOTrainer.

Both sides train the embedded default (reverse 8 digits, 32 prompts x 8 samples a step, KL 0.04 to
the reference) from identical initial weights, each in a subprocess of its own, interleaved
(ours, TRL 1 thread, TRL 2 threads, then the next round; round r runs seed r on every side, and
the ratio is of the medians over rounds). Ours uses both cores its own way (`threads.lanes`), so TRL
runs with each torch thread count of `--trl-threads` and the ratio is taken against its fastest:

- ours: the real command, ``rl grpo train -q -o TMP eval.target_accuracy=T``: no task arguments,
  the target only makes `Trainer.fit` stop after the step whose eval reaches it.
- TRL: trl 1.16's `GRPOTrainer` in ``python vs_trl.py --trl-child SPEC``, its settings mapped from
  our `GRPOConfig` by `trl_settings` (what has no TRL equivalent is refused by `_check_mappable`).
  Model: our initial policy (`policy.initial_model`: the seed, then `build_model`), saved once by
  the driver and loaded by TRL from that directory as policy and reference; the saved weights are
  checked equal to a fresh `initial_model`. Tokenizer: our `CharTokenizer` as a
  `PreTrainedTokenizerFast` (WordLevel vocab, one token per character, same ids; checked). Data: the
  prompts our trainer draws, in its order (`SyntheticTask.batch`), unshuffled. Reward: our verifiers
  and weights on the decoded completions. A callback evaluates greedy accuracy on our held-out
  prompts every `eval.every` steps as `greedy_eval` defines it (greedy, stop at EOS, decoded without
  special tokens, the accuracy verifier >= 1) and stops training at the target.

Clock: each side's starts just before its `Popen`, so interpreter start, imports, Ray, model
building and data set-up count. Every 50 ms the driver reads the new lines of the side's line file
(ours: the run's metrics.jsonl; TRL: the child's events.jsonl) and stamps them with their arrival;
both files get a step's line right after that step's eval. A step's "seconds since start" is its
stamp (at most 50 ms late, on both sides alike) and time to accuracy is the stamp of the first line
with accuracy >= target. As a check on our side, time/startup + the sum of time/step and time/eval up
to that step is reported next to it: the difference is what our trainer does not time (the
interpreter, the CLI's imports and config checks before `train` starts its clock, metric writing).
"s/step" is the median over steps 6+ of each side's step time without its eval (ours: time/step;
TRL: from one step's end to the next, its eval taken out).

Memory: on the same ticks the driver sums RSS over the child and all its descendants (Ray's GCS,
raylet and workers when ours runs on Ray), refreshing the process list every 0.5 s; every 1 s it
also sums PSS and USS (smaps_rollup, where pages shared between processes count once).

    python packages/grpo/benchmarks/bench_grpo.py --vs-trl [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

    from entrepot.grpo.config import GRPOConfig

TICK_S = 0.05  # driver sampling period: line files and RSS
REFRESH_TICKS = 10  # re-list the process tree every 0.5 s
FULL_INFO_TICKS = 20  # PSS / USS every 1 s
SAMPLE_PROMPT = "31415926="


# ------------------------------------------------------------------------------------------------
# the TRL side: settings, tokenizer and initial model from ours


def _check_mappable(config: GRPOConfig) -> None:
    """Refuse configs whose training has no exact TRL counterpart in `trl_settings`."""
    algo, roll = config.algorithm, config.rollout
    mismatches = {
        "algorithm.kl_kind (k3 in TRL)": algo.kl_kind in ("low_var_kl", "k3") or algo.kl_coef == 0,
        "algorithm.kl_in_reward": not algo.kl_in_reward,
        "algorithm.loss_agg (token-mean = TRL 'dapo')": algo.loss_agg == "token-mean",
        "algorithm.dynamic_sampling": not algo.dynamic_sampling,
        "algorithm.entropy_coef": algo.entropy_coef == 0,
        "algorithm.mini_batch_size": algo.mini_batch_size in (None, roll.batch_size),
        "algorithm.lr_schedule": algo.lr_schedule == "constant" and algo.warmup_steps == 0,
        "rollout.stop_on_eos": roll.stop_on_eos,
        "rollout.partial_max_tokens": roll.partial_max_tokens is None,
        "reward.models": not config.reward.models,
        "data.task": (config.data.task in ("reverse", "addition") and config.model.path is None)
        or (config.data.task == "word_problems" and config.model.path is not None),
    }
    bad = [key for key, ok in mismatches.items() if not ok]
    if bad:
        raise ValueError(f"no TRL counterpart for these settings of the config: {', '.join(bad)}")


def trl_settings(config: GRPOConfig, output_dir: str, max_steps: int) -> dict[str, Any]:
    """Keyword arguments of `trl.GRPOConfig` equal to our `config`'s training (one process, CPU, fp32).

    Our token-mean over the step's rows is TRL's "dapo" loss: the sum over completion tokens divided
    by the generation batch's token count (one process, no gradient accumulation; "bnpo" equals it
    here too). One generation per optimizer step (generation batch = train batch, accumulation 1),
    completions capped at our response budget, the dataset in order (`shuffle_dataset=False`).
    """
    from entrepot.grpo.data.lengths import response_budget

    _check_mappable(config)
    algo, roll = config.algorithm, config.rollout
    rows = roll.batch_size
    return {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "seed": config.seed,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "per_device_train_batch_size": rows,
        "gradient_accumulation_steps": 1,
        "generation_batch_size": rows,
        "num_generations": roll.n_samples_per_prompt,
        "num_iterations": algo.epochs,
        "max_completion_length": response_budget(config.data, config.rollout),
        "temperature": roll.temperature,
        "top_p": roll.top_p,
        "top_k": roll.top_k,
        "beta": algo.kl_coef,
        "epsilon": algo.clip_low,
        "epsilon_high": algo.clip_high,
        "loss_type": "dapo",
        "scale_rewards": "group" if algo.normalize_std else "none",
        "mask_truncated_completions": False,
        "reward_weights": list(config.reward.verifiers.values()),
        "learning_rate": algo.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",  # torch.optim.AdamW, as ours
        "adam_beta1": algo.adam_betas[0],
        "adam_beta2": algo.adam_betas[1],
        "adam_epsilon": 1e-8,  # torch's default, ours
        "weight_decay": algo.weight_decay,
        "max_grad_norm": algo.grad_clip if algo.grad_clip is not None else 0.0,
        "shuffle_dataset": False,
        "disable_dropout": True,
        "dataloader_pin_memory": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": max(config.eval.every, 1),
        "disable_tqdm": True,
    }


def char_tokenizer() -> Any:
    """Our `CharTokenizer` as a `transformers.PreTrainedTokenizerFast`: same ids, pad and eos, no specials
    added on encode, decoded without separators; a character outside the alphabet is an error."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from entrepot.grpo.data.tasks import CharTokenizer

    ours = CharTokenizer()
    backend = Tokenizer(WordLevel({token: i for i, token in enumerate(ours.tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=ours.pad_token, eos_token=ours.eos_token,
        clean_up_tokenization_spaces=False,
    )  # fmt: skip


def check_tokenizer(tokenizer: Any) -> None:
    """`tokenizer` encodes and decodes as our `CharTokenizer` (as TRL calls it: `tokenizer(text=[...])`)."""
    from entrepot.grpo.data.tasks import CharTokenizer

    ours = CharTokenizer()
    ids = tokenizer(text=[SAMPLE_PROMPT])["input_ids"][0]
    assert ids == ours.encode(SAMPLE_PROMPT), (ids, ours.encode(SAMPLE_PROMPT))
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (ours.pad_token_id, ours.eos_token_id)
    mixed = [*ours.encode("6295"), ours.eos_token_id, ours.pad_token_id]
    assert tokenizer.decode(mixed, skip_special_tokens=True) == ours.decode(mixed) == "6295"


def save_initial_model(config: GRPOConfig, directory: Path) -> None:
    """Save our initial policy and the tokenizer to `directory`; check the saved weights load back equal."""
    from transformers import AutoModelForCausalLM

    from entrepot.grpo.engines.policy import initial_model

    model, _ = initial_model(config)
    model.save_pretrained(directory)
    tokenizer = char_tokenizer()
    check_tokenizer(tokenizer)
    tokenizer.save_pretrained(directory)
    fresh, _ = initial_model(config)  # the seed alone fixes the weights
    loaded = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    _assert_same_weights(fresh.state_dict(), loaded.state_dict())


def _assert_same_weights(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    import torch

    assert ours.keys() == theirs.keys(), sorted(set(ours) ^ set(theirs))
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, f"initial weights differ: {different[:5]}"


# ------------------------------------------------------------------------------------------------
# the TRL child process


@dataclass
class _EvalSet:
    """Held-out prompts (left-padded ids), their answers and the accuracy verifier."""

    ids: Any
    mask: Any
    answers: list[str]
    verifier: Callable[[str, str], float]
    max_new_tokens: int


def _greedy_accuracy(model: Any, tokenizer: Any, data: _EvalSet) -> float:
    """`greedy_eval`'s accuracy with HF generate: greedy, stop at EOS, decode without special tokens."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False, max_new_tokens=data.max_new_tokens, disable_compile=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=data.ids, attention_mask=data.mask, generation_config=config)
    model.train(training)
    texts = tokenizer.batch_decode(out[:, data.ids.shape[1] :], skip_special_tokens=True)
    hits = [data.verifier(text, answer) >= 1.0 for text, answer in zip(texts, data.answers, strict=True)]
    return sum(hits) / len(hits)


def _trl_callback(
    emit: Callable[..., None], tokenizer: Any, data: _EvalSet, every: int, target: float
) -> Any:
    """A TrainerCallback: one line per step (its time without eval), greedy accuracy every `every` steps
    (stopping at `target`), and TRL's logged metrics."""
    from transformers import TrainerCallback

    class Callback(TrainerCallback):
        mark = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            emit(kind="phase", name="train_begin")
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            record: dict[str, Any] = {"kind": "step", "step": state.global_step}
            record["step_s"] = time.perf_counter() - self.mark
            if every and state.global_step % every == 0:
                started = time.perf_counter()
                record["accuracy"] = _greedy_accuracy(model, tokenizer, data)
                record["eval_s"] = time.perf_counter() - started
                control.should_training_stop = record["accuracy"] >= target
            emit(**record)
            self.mark = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            emit(kind="log", step=state.global_step, **{k: v for k, v in (logs or {}).items()
                                                          if isinstance(v, int | float)})  # fmt: skip

    return Callback()


def _reward_funcs(verifiers: Sequence[str]) -> list[Callable[..., list[float]]]:
    """TRL reward functions of our named verifiers (scored on decoded completion vs answer)."""
    from entrepot.grpo.data.rewards import get_verifier

    def make(name: str) -> Callable[..., list[float]]:
        verifier = get_verifier(name)

        def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
            return [float(verifier(c, a)) for c, a in zip(completions, answer, strict=True)]

        reward.__name__ = name
        return reward

    return [make(name) for name in verifiers]


TrainTRL = Callable[[dict[str, Any], Callable[..., None]], None]


def trl_child(spec_path: Path, train: TrainTRL | None = None) -> None:
    """Train with TRL's GRPOTrainer as `spec_path` says; events go, one JSON line each, to spec['events'].

    `train(spec, emit)` trains (default: this module's `_train_trl`, on the synthetic tasks).
    """
    spec = json.loads(spec_path.read_text())
    with Path(spec["events"]).open("a", buffering=1) as events:

        def emit(**record: Any) -> None:
            events.write(json.dumps({**record, "wall": time.time()}) + "\n")

        (train or _train_trl)(spec, emit)


def _train_trl(spec: dict[str, Any], emit: Callable[..., None]) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from entrepot.grpo.data.rewards import get_verifier
    from entrepot.grpo.data.tasks import SyntheticTask

    torch.set_num_threads(spec["threads"])
    torch.set_num_interop_threads(spec["interop_threads"])
    emit(kind="phase", name="imports")
    task = SyntheticTask(spec["task"], spec["num_digits"], seed=spec["seed"])
    args = GRPOConfig(**spec["trl"])
    samples = task.batch(0, args.max_steps * args.generation_batch_size // args.num_generations)
    train = Dataset.from_dict({"prompt": [s.prompt for s in samples], "answer": [s.answer for s in samples]})
    tokenizer = AutoTokenizer.from_pretrained(spec["model"], local_files_only=True)
    check_tokenizer(tokenizer)  # as loaded back by TRL's side
    held = task.held_out(spec["eval_prompts"])
    encoded = tokenizer([s.prompt for s in held], padding=True, padding_side="left", return_tensors="pt")
    data = _EvalSet(encoded["input_ids"], encoded["attention_mask"], [s.answer for s in held],
                    get_verifier(spec["accuracy_verifier"]), args.max_completion_length)  # fmt: skip
    callback = _trl_callback(emit, tokenizer, data, spec["eval_every"], spec["target"])
    args.model_init_kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=_reward_funcs(spec["verifiers"]), args=args,
                          train_dataset=train, processing_class=tokenizer, callbacks=[callback])  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    assert trainer.ref_model is not None and torch.get_num_threads() == spec["threads"]
    _assert_same_weights(trainer.model.state_dict(), trainer.ref_model.state_dict())
    emit(kind="phase", name="trainer_built")
    trainer.train()
    emit(kind="phase", name="done")


# ------------------------------------------------------------------------------------------------
# the driver: run a command, stamp its lines, sum its processes' memory


class _TreeMemory:
    """Peak memory of a process and all its descendants (RSS every tick; PSS / USS when asked)."""

    def __init__(self, root: psutil.Process) -> None:
        self.root = root
        self.procs: list[psutil.Process] = [root]
        self.peak_rss = self.peak_pss = self.peak_uss = 0
        self.at_peak: list[str] = []
        self.max_procs = 1

    def refresh(self) -> None:
        import psutil

        try:
            self.procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        self.max_procs = max(self.max_procs, len(self.procs))

    def sample(self, full: bool) -> None:
        import psutil

        rss = pss = uss = 0
        names = []
        for proc in self.procs:
            try:
                if full:
                    info = proc.memory_full_info()
                    pss, uss = pss + info.pss, uss + info.uss
                else:
                    info = proc.memory_info()
                rss += info.rss
                names.append(f"{proc.name()} {info.rss / 2**20:.0f}")
            except psutil.Error:
                continue
        if rss > self.peak_rss:
            self.peak_rss, self.at_peak = rss, names
        self.peak_pss, self.peak_uss = max(self.peak_pss, pss), max(self.peak_uss, uss)


class _LineReader:
    """New complete lines of a JSON-lines file (found by a glob once it exists), stamped on arrival."""

    def __init__(self, directory: Path, pattern: str) -> None:
        self.directory, self.pattern = directory, pattern
        self.path: Path | None = None
        self.offset = 0
        self.lines: list[tuple[float, dict[str, Any]]] = []

    def read(self, now: float) -> None:
        if self.path is None:
            self.path = next(iter(sorted(self.directory.glob(self.pattern))), None)
            if self.path is None:
                return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.lines += [(now, json.loads(line)) for line in complete.splitlines() if line.strip()]


@dataclass
class Run:
    """One side's run: exit code, wall seconds, its stamped lines and peak memory (bytes)."""

    side: str
    returncode: int
    wall_s: float
    start_wall: float
    lines: list[tuple[float, dict[str, Any]]]
    peak_rss: int
    peak_pss: int
    peak_uss: int
    max_procs: int
    at_peak: list[str] = field(default_factory=list)
    log_tail: str = ""


def watch(side: str, cmd: list[str], env: dict[str, str], reader: _LineReader, log: Path,
          timeout_s: float) -> Run:  # fmt: skip
    """Run `cmd`, stamping `reader`'s lines and sampling the memory of its process tree every tick."""
    import psutil

    start_wall, start = time.time(), time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    memory = _TreeMemory(psutil.Process(proc.pid))
    tick = 0
    while proc.poll() is None:
        now = time.perf_counter() - start
        if now > timeout_s:
            _kill_tree(memory)
            break
        if tick % REFRESH_TICKS == 0:
            memory.refresh()
        memory.sample(full=tick % FULL_INFO_TICKS == 0)
        reader.read(now)
        tick += 1
        time.sleep(max(0.0, start + tick * TICK_S - time.perf_counter()))
    wall = time.perf_counter() - start
    proc.wait()
    reader.read(wall)
    tail = log.read_text(errors="replace")[-3000:] if proc.returncode else ""
    return Run(side, proc.returncode, wall, start_wall, reader.lines, memory.peak_rss, memory.peak_pss,
               memory.peak_uss, memory.max_procs, memory.at_peak, tail)  # fmt: skip


def _kill_tree(memory: _TreeMemory) -> None:
    """Kill the run we started and its descendants (by pid), after a timeout."""
    import psutil

    memory.refresh()
    for proc in reversed(memory.procs):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _child_env(config: GRPOConfig) -> dict[str, str]:
    """This environment with our run's thread settings (both sides alike) and no hub access."""
    from entrepot.grpo.embedded.threads import worker_env

    return {**os.environ, **worker_env(config.threads), "HF_HUB_OFFLINE": "1"}


def _rl_command() -> str:
    found = shutil.which("rl", path=str(Path(sys.executable).parent)) or shutil.which("rl")
    if found is None:
        raise SystemExit("--vs-trl times the `rl` command: install entrepot-cli in this environment")
    return found


def run_ours(config: GRPOConfig, target: float, work: Path, timeout_s: float) -> Run:
    """`rl grpo train` with no task arguments, stopping at `target`, its run directory under `work`."""
    cmd = [_rl_command(), "grpo", "train", "-q", "-o", str(work), f"eval.target_accuracy={target}"]
    cmd += [] if config.seed == 0 else ["--seed", str(config.seed)]  # seed 0: no arguments at all
    reader = _LineReader(work, f"*/{config.logging.metrics_file}")
    return watch("ours", cmd, _child_env(config), reader, work / "ours.log", timeout_s)


def run_trl(config: GRPOConfig, model_dir: Path, target: float, max_steps: int, work: Path,
            timeout_s: float, threads: int) -> Run:  # fmt: skip
    """TRL's GRPOTrainer in a child process (`trl_child`) with `threads` torch threads, stopping at
    `target` or `max_steps`."""
    spec = {
        "trl": trl_settings(config, str(work / "trl_out"), max_steps),
        "model": str(model_dir),
        "events": str(work / "events.jsonl"),
        "task": config.data.task,
        "num_digits": config.data.num_digits,
        "seed": config.seed,
        "verifiers": list(config.reward.verifiers),
        "accuracy_verifier": config.reward.accuracy_verifier,
        "eval_prompts": config.eval.num_prompts,
        "eval_every": config.eval.every,
        "target": target,
        "threads": threads,
        "interop_threads": config.threads.interop_threads,
    }
    (work / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(work / "spec.json")]
    reader = _LineReader(work, "events.jsonl")
    return watch(_trl_side(threads), cmd, _child_env(config), reader, work / "trl.log", timeout_s)


def _trl_side(threads: int) -> str:
    return f"TRL {threads}t"


# ------------------------------------------------------------------------------------------------
# summaries


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _steps(run: Run, every: int) -> list[dict[str, Any]]:
    """One dict per step, alike on both sides: its stamp `t`, `step_s` and `eval_s`, and (on eval steps)
    `accuracy` and `reward`, the mean training reward of the last `every` steps (TRL logs it so)."""
    if run.side == "ours":
        rewards = [m.get("reward_mean", 0.0) for _, m in run.lines]
        out = []
        for i, (t, m) in enumerate(run.lines):
            step = {"step": m["step"], "t": t, "step_s": m["time/step"], "eval_s": m.get("time/eval", 0.0)}
            if "accuracy" in m:
                window = rewards[max(0, i + 1 - every) : i + 1]
                step.update(accuracy=m["accuracy"], reward=sum(window) / len(window))
            out.append(step)
        return out
    logged = {m["step"]: m["reward"] for _, m in run.lines if m.get("kind") == "log" and "reward" in m}
    steps = [{**m, "t": t} for t, m in run.lines if m.get("kind") == "step"]
    for step in steps:
        step.setdefault("eval_s", 0.0)
        if "accuracy" in step:
            step["reward"] = logged.get(step["step"])
    return steps


def _curve(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("step", "t", "accuracy", "reward")
    return [{k: step.get(k) for k in keys} for step in steps if "accuracy" in step]


def summarize(run: Run, target: float, every: int) -> dict[str, Any]:
    """The table's figures of one run (seconds since the command started; None where not reached)."""
    steps = _steps(run, max(every, 1))
    hit = next((step for step in steps if step.get("accuracy", -1.0) >= target), None)
    until = [step for step in steps if hit is None or step["step"] <= hit["step"]]
    eval_s = sum(step["eval_s"] for step in until)
    out: dict[str, Any] = {
        "side": run.side,
        "returncode": run.returncode,
        "wall_s": run.wall_s,
        "steps": len(steps),
        "s_per_step": _median([step["step_s"] for step in steps[5:]]),
        "s_per_step_mean": statistics.fmean(step["step_s"] for step in steps) if steps else None,
        "start_s": steps[0]["t"] - steps[0]["step_s"] if steps else None,
        "first_step_s": steps[0]["t"] if steps else None,
        "steps_to_target": hit["step"] if hit else None,
        "s_to_target": hit["t"] if hit else None,
        "eval_s_to_target": eval_s,
        "s_to_target_excl_eval": hit["t"] - eval_s if hit else None,
        "peak_rss_mb": run.peak_rss / 2**20,
        "peak_pss_mb": run.peak_pss / 2**20,
        "peak_uss_mb": run.peak_uss / 2**20,
        "max_procs": run.max_procs,
        "procs_at_peak_mb": run.at_peak,
        "curve": _curve(steps),
    }
    if run.side == "ours" and steps:
        out["trainer_startup_s"] = startup = run.lines[0][1].get("time/startup", 0.0)
        out["trainer_timed_s"] = startup + sum(step["step_s"] + step["eval_s"] for step in until)
    else:
        out["phases_s"] = {
            m["name"]: m["wall"] - run.start_wall for _, m in run.lines if m.get("kind") == "phase"
        }
    return out


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (
    ("run", 8, "", "side"),
    ("seed", 5, "d", "seed"),
    ("s/step", 8, ".3f", "s_per_step"),
    ("start", 7, ".1f", "start_s"),
    ("step 1", 8, ".1f", "first_step_s"),
    ("steps->acc", 11, "d", "steps_to_target"),
    ("s->acc", 8, ".1f", "s_to_target"),
    ("(no eval)", 10, ".1f", "s_to_target_excl_eval"),
    ("eval s", 8, ".1f", "eval_s_to_target"),
    ("RSS MB", 8, ".0f", "peak_rss_mb"),
    ("PSS MB", 8, ".0f", "peak_pss_mb"),
    ("USS MB", 8, ".0f", "peak_uss_mb"),
    ("procs", 6, "d", "max_procs"),
)


def print_table(rows: list[dict[str, Any]], target: float) -> None:
    print(f"\nrl grpo train vs TRL GRPOTrainer: seconds since the command started, target accuracy {target}")
    print("".join(f"{title:>{width}}" for title, width, _, _ in COLUMNS))
    for row in rows:
        cells = [row[key] if spec == "" else _fmt(row.get(key), spec) for _, _, spec, key in COLUMNS]
        print("".join(f"{cell:>{width}}" for cell, (_, width, _, _) in zip(cells, COLUMNS, strict=True)))
    for row in rows:
        if row["side"] == "ours" and row.get("trainer_timed_s") is not None and row["s_to_target"]:
            timed, clock = row["trainer_timed_s"], row["s_to_target"]
            print(f"ours: start-up + steps + evals as the trainer times them, to the target: {timed:.1f} s "
                  f"(the clock: {clock:.1f} s)")  # fmt: skip
        if row["side"].startswith("TRL"):
            phases = ", ".join(f"{k} {v:.1f}" for k, v in row.get("phases_s", {}).items())
            print(f"TRL phases (s since start): {phases}")


def print_ratio(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median time to accuracy of each side, and ours / TRL at TRL's fastest thread count (target <= 0.5)."""
    medians: dict[str, float | None] = {}
    for side in dict.fromkeys(r["side"] for r in rows):
        times = [r["s_to_target"] for r in rows if r["side"] == side and r["s_to_target"] is not None]
        medians[side] = _median(times)
    trl_sides = {side: t for side, t in medians.items() if side.startswith("TRL") and t is not None}
    best = min(trl_sides, key=lambda side: trl_sides[side]) if trl_sides else None
    ours, trl = medians.get("ours"), trl_sides.get(best) if best else None
    ratio = ours / trl if ours and trl else None
    each = ", ".join(f"{side} {_fmt(t)} s" for side, t in medians.items())
    print(f"\ntime to accuracy, median over seeds: {each}; ours / {best} (TRL's fastest) = "
          f"{_fmt(ratio, '.2f')} (target <= 0.5)")  # fmt: skip
    for key, what in (("steps_to_target", "steps to the target"), ("s_per_step", "s/step")):
        per_side = {side: _median([r[key] for r in rows if r["side"] == side and r[key] is not None])
                    for side in medians}  # fmt: skip
        print(f"{what}, median: " + ", ".join(f"{side} {_fmt(v, '.3g')}" for side, v in per_side.items()))
    return {**medians, "ratio": ratio, "trl_baseline": best}  # type: ignore[dict-item]


def print_curves(rows: list[dict[str, Any]]) -> None:
    """Each repeat's eval steps, ours and its first TRL run side by side: seconds since start, greedy
    accuracy, mean training reward."""
    starts = [i for i, row in enumerate(rows) if row["side"] == "ours"]
    for pair, at in enumerate(starts):
        if at + 1 >= len(rows):
            break
        ours, trl = ({p["step"]: p for p in row["curve"]} for row in rows[at : at + 2])
        print(f"\ncurves, pair {pair + 1}: {'step':>6} | {'ours: s':>8} {'acc':>5} {'reward':>6} | "
              f"{'TRL: s':>8} {'acc':>5} {'reward':>6}")  # fmt: skip
        for step in sorted(ours.keys() | trl.keys()):
            cells = [_point(side.get(step)) for side in (ours, trl)]
            print(f"{'':>17}{step:>6} | {cells[0]} | {cells[1]}")


def _point(point: dict[str, Any] | None) -> str:
    if point is None:
        return f"{'':>21}"
    return f"{_fmt(point['t']):>8} {_fmt(point['accuracy'], '.2f'):>5} {_fmt(point['reward'], '.3f'):>6}"


def _memory_line(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(f"{row['side']} peak RSS by process (MB): {', '.join(row['procs_at_peak_mb'])}")


# ------------------------------------------------------------------------------------------------
# entry points


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the TRL comparison (bench_grpo.py --vs-trl shares --target and --out)."""
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds (ours, then TRL at each thread count), round r with seed r")  # fmt: skip
    parser.add_argument("--trl-max-steps", type=int, default=400, help="TRL's cap when it misses the target")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    parser.add_argument("--trl-threads", default="1,2",
                        help="torch thread counts TRL runs with (the ratio uses its fastest)")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved runs of both sides; prints the table, the ratio and the curves; returns the results."""
    from entrepot.grpo import load_config

    load = {"start": os.getloadavg()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        root = Path(tmp)
        sides = ["ours", *(_trl_side(int(t)) for t in str(args.trl_threads).split(","))]
        for repeat in range(args.repeats):
            # round r: seed r (weights, data order, sampling) on every side; seed 0 is `rl grpo train`
            # with no arguments. Steps to the target vary with the seed (130-200 here), so rounds do
            config = load_config(None, [f"seed={repeat}"])
            save_initial_model(config, root / f"model-{repeat}")
            for side in sides:
                work = root / f"{side.replace(' ', '-')}-{repeat}"
                work.mkdir()
                result = _run_side(side, config, args, root / f"model-{repeat}", work)
                if result.returncode:
                    print(f"{side} run {repeat + 1} exited with {result.returncode}:\n{result.log_tail}")
                rows.append({**summarize(result, args.target, config.eval.every), "seed": repeat})
                print(f"done: {side} seed {repeat} ({result.wall_s:.0f} s)", flush=True)
    load["end"] = os.getloadavg()
    print(f"\nload average (1, 5, 15 min): start {load['start']}, end {load['end']}")
    print_table(rows, args.target)
    summary = print_ratio(rows)
    _memory_line(rows)
    print_curves(rows)
    results = {"target": args.target, "load": load, "summary": summary, "runs": rows,
               "trl_settings": trl_settings(config, "<tmp>", args.trl_max_steps)}  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vs_trl.json").write_text(json.dumps(results, indent=1, default=_jsonable))
    return results


def _run_side(side: str, config: GRPOConfig, args: argparse.Namespace, model_dir: Path, work: Path) -> Run:
    if side == "ours":
        return run_ours(config, args.target, work, args.timeout)
    threads = int(side.removeprefix("TRL ").removesuffix("t"))
    return run_trl(config, model_dir, args.target, args.trl_max_steps, work, args.timeout, threads)


def _jsonable(value: Any) -> Any:
    return asdict(value) if hasattr(value, "__dataclass_fields__") else str(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trl-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=None, help="write vs_trl.json here")
    add_arguments(parser)
    args, _ = parser.parse_known_args(argv)
    if args.trl_child is not None:
        trl_child(args.trl_child)
    else:
        run(args)


if __name__ == "__main__":
    main()
