"""`rl eval`: evaluate a checkpoint or model directory outside its run, in this process.

`prepare` does everything that can fail on bad input (the target and its manifest, the engine, the
settings and ks, the prompts against the task) without loading a model; `run` then builds the actor
from the checkpoint's own config, loads its weights, decodes with `ActorWorker.evaluate_records` (the
code the in-run evaluation runs) and writes ``eval.json`` / ``eval_samples.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from entrepot.grpo.data import code_tests, rewards
from entrepot.grpo.errors import CheckpointError, EvalError
from entrepot.grpo.evaluation.dataset import EvalSet, eval_set, task_setup
from entrepot.grpo.evaluation.records import header, write_eval
from entrepot.grpo.evaluation.runner import EvalRecord, EvalSettings
from entrepot.grpo.evaluation.summary import check_ks, summarize
from entrepot.grpo.evaluation.target import EvalTarget, resolve_target
from entrepot.grpo.run.registry_names import check_reward_names

if TYPE_CHECKING:
    from entrepot.grpo.workers import ActorWorker

__all__ = ["EVAL_ENGINES", "EvalPlan", "EvalResult", "build_worker", "prepare", "run"]

EVAL_ENGINES = ("torch", "hf")  # vllm is refused: see `_check_engine`


@dataclass(frozen=True)
class EvalPlan:
    """A checked evaluation, ready to run: what, on which prompts, how, and where the files go."""

    target: EvalTarget
    data: EvalSet
    settings: EvalSettings
    ks: tuple[int, ...]
    out_dir: Path


@dataclass(frozen=True)
class EvalResult:
    """What `run` wrote and computed."""

    eval_file: Path
    samples_file: Path
    metrics: dict[str, float]
    audit: dict[str, Any]
    records: list[EvalRecord]


def prepare(
    path: str | Path, *, step: int | None = None, data: str | Path | None = None,
    num_prompts: int | None = None, samples: int = 1, ks: Sequence[int] = (),
    temperature: float | None = None,
    seed: int | None = None, engine: str | None = None, config_file: str | Path | None = None,
    out_dir: str | Path | None = None,
) -> EvalPlan:  # fmt: skip
    """Resolve and check an evaluation (`EvalError` / `CheckpointError` naming what is wrong); no model
    loads. Sampled when `samples` > 1 or `temperature` > 0 (default temperature then: the run's
    ``rollout.temperature``), greedy otherwise; `ks` default to (1,) (and `samples` when larger)."""
    chosen = tuple(ks) or tuple(dict.fromkeys((1, samples)))
    check_ks(chosen, samples)  # before the checkpoint is even read: the cheapest mistake first
    target = resolve_target(path, step=step, config_file=config_file)
    config = target.config
    name = engine or config.engine.rollout
    _check_engine(name)
    if name == "hf" and config.model.path is None:
        raise EvalError(
            "--engine hf runs HF generate on an HF model, and this checkpoint's policy is the built decoder "
            "(no model.path): export it (rl grpo export RUN) and evaluate RUN/export/step_N --engine hf"
        )
    config = replace(config, engine=replace(config.engine, rollout=cast(Any, name), max_logp_mismatch=None))
    target = replace(target, config=config)
    rewards.resolve_custom(config.reward.custom)  # the run's own verifiers score its responses here too
    code_tests.configure(config.reward.code)
    check_reward_names(config.reward, config.audit.format_check)
    if temperature is None:
        temperature = config.rollout.temperature if samples > 1 else 0.0
    rollout = config.rollout
    settings = EvalSettings(
        num_samples=samples, temperature=temperature, top_p=rollout.top_p if temperature else 1.0,
        top_k=rollout.top_k if temperature else 0, seed=config.seed if seed is None else seed,
    )  # fmt: skip
    setup = task_setup(config)
    prompts = eval_set(config, setup, data, num_prompts)
    if not prompts.samples:
        raise EvalError("the evaluation set holds no prompts")
    return EvalPlan(
        target, prompts, settings, chosen, Path(out_dir) if out_dir else _default_out(target, settings)
    )


def _check_engine(name: str) -> None:
    if name == "vllm":
        raise EvalError(
            "--engine vllm: rl eval runs the torch (embedded KV-cache) and hf (HF generate) engines in this "
            "process; vLLM evaluation is not offered because it is untested here (no vLLM build in the "
            "test environment): use --engine torch"
        )
    if name not in EVAL_ENGINES:
        raise EvalError(f"--engine {name!r} is not one of {', '.join(EVAL_ENGINES)}")


def _default_out(target: EvalTarget, settings: EvalSettings) -> Path:
    """``RUN/evals/step_NNNNNN-<how>`` (a model directory outside a run: ``./evals/<name>-<how>``)."""
    how = "greedy" if settings.temperature == 0 else f"t{settings.temperature:g}-n{settings.num_samples}"
    name = f"step_{target.step:06d}" if target.step is not None else Path(str(target.model_dir)).name
    return (target.run_dir or Path(".")) / "evals" / f"{name}-{how}"


def build_worker(target: EvalTarget) -> ActorWorker:
    """The actor of `target.config` in this process, holding the target's weights."""
    from entrepot.grpo.engines.registry import choose_engines
    from entrepot.grpo.run import checkpoint as ckpt
    from entrepot.grpo.workers import ActorWorker

    if target.checkpoint is None:
        return ActorWorker(target.config)  # model.path is the directory evaluated
    config = target.config
    if choose_engines(config.engine).train.shards_weights:  # megatron: its whole-model hf/ export
        return _hf_export_worker(target.checkpoint, config)
    manifest = ckpt.verify_checkpoint(target.checkpoint)
    state, _ = ckpt.read_checkpoint(target.checkpoint, 0, verified=manifest)
    worker = ActorWorker(
        replace(config, resources=replace(config.resources, num_actor_workers=1, use_ray=False))
    )
    worker.load_state([state])
    return worker


def _hf_export_worker(checkpoint: Path, config: Any) -> ActorWorker:
    """A megatron checkpoint's ``hf/`` export in the torch engine of this process."""
    from safetensors.torch import load_file

    from entrepot.grpo.engines.train_torch import TorchTrainer
    from entrepot.grpo.workers import ActorWorker

    export = checkpoint / "hf" / "model.safetensors"
    if not export.is_file():
        raise CheckpointError(
            f"megatron checkpoint {str(checkpoint)!r} has no HF export (hf/model.safetensors)"
        )
    engine = replace(
        config.engine, train="torch", rollout="torch", offload_reference=False, max_logp_mismatch=None
    )
    resources = replace(config.resources, num_actor_workers=1, use_ray=False)
    config = replace(config, engine=engine, parallel=type(config.parallel)(), resources=resources)
    worker = ActorWorker(config)
    model = cast(TorchTrainer, worker.trainer).model  # engine.train=torch, set above
    missing, unexpected = model.load_state_dict(load_file(str(export)), strict=False)
    tied = {"lm_head.weight"} if worker.policy.hf_config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(f"HF export of {str(checkpoint)!r}: missing {missing}, unexpected {unexpected}")
    return worker


def run(plan: EvalPlan, on_progress: Callable[[int], None] | None = None) -> EvalResult:
    """Load the model, decode the prompts, write the two files (the audit's figures included)."""
    from entrepot.grpo.audit.snapshot import audit_records

    worker = build_worker(plan.target)
    records = worker.evaluate_records(plan.data.samples, plan.settings, on_progress)
    config = plan.target.config
    metrics = summarize(records, plan.settings.num_samples, plan.ks)
    audit = audit_records(records, config.audit, config.data.task)
    head = header(plan.target.provenance(), config, plan.settings, plan.data.provenance(), plan.ks,
                  config.engine.rollout)  # fmt: skip
    eval_file, samples_file = write_eval(plan.out_dir, head, metrics, audit, records)
    return EvalResult(eval_file, samples_file, metrics, audit, records)
