"""The public entry points: `train` a config into a run directory, `evaluate` a checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig, dump_yaml
from entrepot.grpo.errors import CheckpointError

__all__ = ["TrainResult", "evaluate", "train"]


@dataclass
class TrainResult:
    """What a run produced."""

    run_dir: Path
    steps: int
    final_metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: Path | None = None
    interrupted: bool = False
    wall_time_s: float = 0.0


def train(
    config: GRPOConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_startup: Callable[[str], None] | None = None,
    on_ready: Callable[[Path], None] | None = None,
    started_at: float | None = None,
) -> TrainResult:
    """Train `config` with the full system (dock + workers), writing into `run_dir`.

    Args:
        config: the run configuration (`load_config(...)` or `GRPOConfig()`).
        run_dir: receives run.json (the run's identity), config.yaml, metrics.jsonl, checkpoints/;
            created only once `check_machine` and `check_inputs` pass (a config that cannot start
            leaves nothing). A new run refuses a folder that already holds one. `check_inputs`
            encodes every prompt (``every_prompt=True``), so a prompt too long for
            ``data.max_prompt_tokens`` is refused here, in seconds, not at the step that draws it.
        resume: continue the run in `run_dir` from its newest checkpoint, which must be the run's own
            (`run.resume.resume_point`, checked before anything starts); the Ray processes a killed
            earlier session of the run left behind are stopped first (`run.ray_session`).
        on_step: called with each step's metrics dict (e.g. for a live display).
        on_startup: called with a line for each start-up phase as it begins.
        on_ready: called with the run folder once every check has passed and the folder exists,
            before anything starts (the CLI prints the folder and starts its display here).
        started_at: `time.perf_counter()` when the caller's start-up began (the CLI passes its
            process's start): the first step's ``time/startup`` and `TrainResult.wall_time_s`
            count from it. None: from the call.

    Returns:
        TrainResult; on Ctrl-C a checkpoint is written and the result has ``interrupted=True``.
    """
    from entrepot.grpo.run.deployment import uses_ray
    from entrepot.grpo.run.identity import check_new_run_folder
    from entrepot.grpo.run.preflight import check_inputs, check_machine
    from entrepot.grpo.run.ray_session import stop_leftovers
    from entrepot.grpo.run.ray_start import start_ray_while_importing
    from entrepot.grpo.run.resume import resume_point

    start = time.perf_counter() if started_at is None else started_at
    say = on_startup or (lambda line: None)
    check_machine(config)
    check_inputs(config, every_prompt=True)
    run = Path(run_dir)
    if resume:
        point = resume_point(run, config)
    else:
        check_new_run_folder(run)
        point = None
    run.mkdir(parents=True, exist_ok=True)
    if on_ready is not None:
        on_ready(run)
    stopped = stop_leftovers(run)
    if stopped:
        say(f"stopped {len(stopped)} process(es) left by the run's killed Ray session: {', '.join(stopped)}")
    ray = uses_ray(config.resources, config.parallel, config.dock)
    say("starting Ray and loading the trainer" if ray else "loading the trainer")
    if ray:  # Ray's processes boot while the trainer's modules import
        start_ray_while_importing(config, run, ["entrepot.grpo.trainer"])
    from entrepot.grpo.run import checkpoint as ckpt
    from entrepot.grpo.trainer import Trainer

    dump_yaml(config, run / "config.yaml")
    trainer = Trainer(config, run, resume=point, on_startup=on_startup, started_at=start)
    interrupted = False
    try:
        trainer.fit(on_step=on_step)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        trainer.close()
    history = trainer.history
    return TrainResult(
        run_dir=run,
        steps=trainer.step,
        final_metrics=history[-1] if history else {},
        history=history,
        checkpoint=ckpt.latest_checkpoint(run),
        interrupted=interrupted,
        wall_time_s=time.perf_counter() - start,
    )


def evaluate(path: str | Path, num_prompts: int | None = None) -> dict[str, float]:
    """Greedy accuracy and reward of a checkpoint (a run directory means its newest checkpoint): the
    in-run evaluation's figures (``accuracy``, ``eval_reward``, ``eval_prompts``) and ``step``.

    Runs in this process: builds the actor from the checkpoint's own config and loads its weights
    after verifying them against the manifest (`evaluation.standalone.build_worker`; a megatron
    checkpoint: its ``hf/`` export in the torch engine). `rl eval` is the fuller form (pass@k, files).
    """
    from entrepot.grpo.evaluation.standalone import build_worker
    from entrepot.grpo.evaluation.target import resolve_target

    target = resolve_target(path)
    if target.checkpoint is None:
        raise CheckpointError(f"{str(path)!r} is neither a run directory nor a checkpoint directory")
    result = build_worker(target).evaluate(num_prompts)
    result["step"] = float(target.step or 0)
    return result
