"""The GRPO run of the full system: start the dock and the workers, run steps, checkpoint, resume.

`Trainer` owns the lifecycle around the step: it launches the cluster (`workers.launch`: Ray or this
process, decided there once), runs `step.GRPOStep` until `max_steps` or the target accuracy, writes
metrics and samples (`metrics.jsonl`, `samples.jsonl`, TensorBoard, W&B), saves and restores
checkpoints, and stops the workers. What one step does, top to bottom,
is in `step.py`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from entrepot.dock import DockStateError
from entrepot.grpo.asynchronous import AsyncSampling
from entrepot.grpo.config import GRPOConfig, config_to_dict
from entrepot.grpo.data.sources import TaskSetup, build_task, encode_prompt
from entrepot.grpo.embedded.host_allocator import release_host_memory
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run import checkpoint as ckpt
from entrepot.grpo.run.deployment import uses_ray
from entrepot.grpo.run.identity import create_run
from entrepot.grpo.run.metrics import MetricsWriter, WandbWriter
from entrepot.grpo.run.resume import ResumePoint
from entrepot.grpo.run.samples import SamplesWriter
from entrepot.grpo.step import PROMPTS_KEY, SAMPLES_KEY, GRPOStep
from entrepot.grpo.workers import (
    ActorWorker,
    Pending,
    ReferenceWorker,
    RewardModelWorker,
    RewardWorker,
    launch,
    wait_all,
)
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["Trainer"]


class Trainer:
    """Builds the dock and the workers for `config` and runs GRPO steps, writing into `run_dir`.

    Args:
        config: the run configuration.
        run_dir: where run.json, metrics.jsonl and checkpoints go (created if missing). A new run
            writes its identity (`run.identity.create_run`) there first, and refuses a folder that
            holds a run already.
        resume: continue the run of `run_dir` from this checkpoint (`run.resume.resume_point`:
            checked to be the run's own); None: a new run.
        on_startup: called with a line for each start-up phase as it begins (a display shows them).
        started_at: `time.perf_counter()` when the caller's part of start-up began (starting Ray,
            importing this module); None: start-up begins here.

    Start-up (workers started, models built, checkpoint restored) is timed on its own: the first
    step of a session reports it as ``time/startup`` and its ``time/step`` excludes it.
    """

    def __init__(
        self, config: GRPOConfig, run_dir: str | Path, *, resume: ResumePoint | None = None,
        on_startup: Callable[[str], None] | None = None, started_at: float | None = None,
    ) -> None:  # fmt: skip
        here = time.perf_counter()
        started = here if started_at is None else started_at
        say = on_startup or (lambda line: None)
        self.config = config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.owner = resume.owner if resume is not None else create_run(self.run_dir, config)
        configure_threads(config.threads)
        where = "on Ray" if uses_ray(config.resources, config.parallel, config.dock) else "in this process"
        ranks = config.resources.num_actor_workers * config.parallel.train.model_parallel
        say(f"starting {ranks} actor rank(s) + {_other_workers(config)} {where}")
        if config.model.lora.enabled:
            say(f"LoRA rank {config.model.lora.rank}: the {config.engine.rollout} rollout engine receives "
                "merged weights (W + scale B A) each step; adapter-only sync is not used")  # fmt: skip
        self.cluster = launch(config, str(self.run_dir))  # Ray (when used) and the dock; workers start
        placement = self.cluster.placement()
        if placement is not None:  # on a cluster: which node each replica got (an error names it too)
            say(placement)
        launched = time.perf_counter()
        self.dock = self.cluster.dock
        self.actors, self.rewards = self.cluster.actors, self.cluster.rewards
        self.setup = build_task(config, self._tokenizer())
        for line in _prompt_lines(config, self.setup):
            say(line)
        self.grpo_step = GRPOStep(config, self.cluster, self.setup)
        if isinstance(self.grpo_step.sampling, AsyncSampling):
            say(self.grpo_step.sampling.describe())
        self.step = 0
        self.history: list[dict[str, Any]] = []  # this session's steps (kept when interrupted)
        self.metrics = MetricsWriter(self.run_dir, config.logging)
        self.samples = SamplesWriter(self.run_dir)
        # asynchronous training: which prompts each step trained
        self.prompts = SamplesWriter(self.run_dir, PROMPTS_FILE)
        self.wandb: WandbWriter | None = None
        try:
            if config.logging.wandb:
                name, values = config.run_name, config_to_dict(config)
                self.wandb = WandbWriter(self.run_dir, config.logging, name, values)
            self._wait([
                self.actors.call(ActorWorker.ready), self.rewards.call(RewardWorker.ready),
                *([self.cluster.references.call(ReferenceWorker.ready)] if self.cluster.references else []),
                *([self.cluster.reward_models.call(RewardModelWorker.ready)]
                  if self.cluster.reward_models else []),
            ])  # fmt: skip
            ready = time.perf_counter()
            say(self._wait([self.actors.call(ActorWorker.rollout_engine)])[0][0])
            if config.algorithm.distill.enabled:
                say(self._wait([self.actors.call(ActorWorker.teacher_description)])[0][0])
            if resume is not None:
                say("restoring the newest checkpoint")
                self._resume(resume, say)
        except BaseException:
            self.close()  # a worker that failed to start (or a bad checkpoint) leaves no workers behind
            raise
        self.startup_s = time.perf_counter() - started
        what = "Ray and imports" if uses_ray(config.resources, config.parallel, config.dock) else "imports"
        before = f"{what} {here - started:.1f} s, " if here - started >= 0.05 else ""
        if uses_ray(
            config.resources, config.parallel, config.dock
        ):  # workers start in their own processes while Ray hands them over
            phases = f"{before}dock {launched - here:.1f} s, workers ready {ready - launched:.1f} s"
        else:
            phases = f"{before}dock and workers built {ready - here:.1f} s"
        say(f"started in {self.startup_s:.1f} s ({phases})")

    def _tokenizer(self) -> Any:
        if self.config.model.path is None:
            return None
        from entrepot.grpo.engines.models import load_tokenizer

        return load_tokenizer(self.config.model.path)

    # -- running stages -------------------------------------------------------------------------

    def _wait(self, pendings: Sequence[Pending[Any]]) -> list[list[Any]]:
        return wait_all(pendings, self.config.resources.stage_timeout_s)

    # -- the loop -------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run steps until `max_steps` (or the target accuracy); checkpoint on Ctrl-C and re-raise.

        A failed step (`StageError`, a timeout) propagates without a checkpoint: the run directory
        keeps its last good one, and `--resume` continues from there. So does a Ctrl-C that lands in
        the middle of a step (a second Ctrl-C): a half-done step is never checkpointed.
        """
        history = self.history
        at_boundary = True
        try:
            while self.step < self.config.max_steps:
                at_boundary = False
                metrics = self.train_step()
                at_boundary = True
                samples = metrics.pop(SAMPLES_KEY, None)  # records of their own, not metrics
                trained = metrics.pop(PROMPTS_KEY, None)
                if trained is not None:
                    self.prompts.write([{"step": self.step, "prompts": trained}])
                history.append(metrics)
                self.metrics.write(metrics)
                if samples is not None:
                    self.samples.write(samples)
                if self.wandb is not None:
                    self.wandb.write(metrics, samples)
                if on_step is not None:  # a display shows the latest sample
                    on_step(metrics if samples is None else {**metrics, SAMPLES_KEY: samples})
                every = self.config.checkpoint.save_every
                if every and self.step % every == 0 and self.step < self.config.max_steps:
                    self.save()
                target = self.config.eval.target_accuracy
                if target is not None and metrics.get("accuracy", 0.0) >= target:
                    break
        except KeyboardInterrupt:
            if at_boundary:
                self.save()
            raise
        self.save()
        return history

    def train_step(self) -> dict[str, Any]:
        """One GRPO iteration through the dock (`step.GRPOStep`); returns the step's metrics."""
        metrics = self.grpo_step(self.step)
        self.step += 1
        if not self.history:  # this session's first step: its start-up, timed apart from the step
            metrics["time/startup"] = self.startup_s
        return metrics

    @property
    def data_position(self) -> int:
        """Prompts drawn so far (dynamic sampling draws more than one batch a step)."""
        return self.grpo_step.data_position

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self) -> Path:
        """Write a checkpoint of the current step and prune.

        Besides the training state and the dock, sharded weights (megatron) and LoRA policies also
        get an HF directory `hf/` of the whole (merged) model; LoRA's adapter goes in `hf/adapter/`.
        """
        states = self._wait([self.actors.call(ActorWorker.state)])[0]
        directory = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        sampling = self.grpo_step.sampling
        meta = {"step": self.step, "data_position": self.data_position, "config": config_to_dict(self.config),
                "sampling": sampling.state(),
                "audit": {} if self.grpo_step.audit is None else self.grpo_step.audit.state()}  # fmt: skip
        writers: list[Callable[[Path], Any]] = []
        if sampling.dock_in_checkpoint:  # asynchronous: the outstanding prompts are redone instead
            # a Ray dock saves to an absolute path
            writers.append(lambda tmp: self.dock.save(str((tmp / "dock.pt").resolve())))
        if choose_engines(self.config.engine).train.shards_weights or self.config.model.lora.enabled:
            writers.append(lambda tmp: self._wait([self.actors.call(ActorWorker.export_hf, str(tmp / "hf"))]))
        shards = [_shard(rank) for rank in self.actors.ranks]
        ckpt.write_checkpoint(directory, states, meta, writers, shards, owner=self.owner)
        del states
        release_host_memory()  # what serialising the state freed (an in-process run's workers are here)
        ckpt.prune(self.run_dir, self.config.checkpoint.keep_last)
        return directory

    def _resume(self, point: ResumePoint, say: Callable[[str], None]) -> None:
        """Restore the checkpoint `point` (verified, and checked to be this run's, by `resume_point`)."""
        directory, manifest = point.directory, point.manifest
        if point.skipped:
            say(f"skipping {', '.join(point.skipped)} (no manifest.json: a save that was stopped)")
        states = []
        meta: dict[str, Any] = {}
        for rank in self.actors.ranks:
            state, meta = ckpt.read_checkpoint(directory, rank.rank, _shard(rank), verified=manifest)
            states.append(state)
        self._wait([self.actors.call(ActorWorker.load_state, states)])
        if "dock.pt" in manifest.files:
            try:
                self.dock.load(str((directory / "dock.pt").resolve()))  # a Ray dock resolves from its run dir
            except DockStateError as error:
                raise CheckpointError(f"checkpoint {str(directory)!r}: dock.pt: {error}") from error
        self.step = point.step
        self.grpo_step.restored(int(meta["data_position"]))  # after the dock: its counters as saved
        self.grpo_step.sampling.restore(meta.get("sampling", {}), self.step)
        if self.grpo_step.audit is not None:  # its baselines and first flags, as saved
            self.grpo_step.audit.restore(meta.get("audit", {}))
        self.metrics.truncate(self.step)  # steps after the checkpoint run again
        self.samples.truncate(self.step)
        self.prompts.truncate(self.step)
        (self.run_dir / "resumed_from.json").write_text(
            json.dumps({"checkpoint": str(directory), "step": self.step})
        )

    # -- inspection (tests, benchmarks) ---------------------------------------------------------

    def parameters(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """A copy of rank `rank`'s trainable parameters."""
        return dict(self._wait([self.actors.call(ActorWorker.parameters_digest)])[0][rank])

    def gradients(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """A copy of rank `rank`'s gradients of the last optimiser step (after clipping)."""
        return dict(self._wait([self.actors.call(ActorWorker.gradients_digest)])[0][rank])

    def close(self) -> None:
        """Stop the workers (the Ray runtime itself stays up for the next run in this process)."""
        grpo_step = getattr(self, "grpo_step", None)
        if grpo_step is not None:
            grpo_step.sampling.close()  # the asynchronous rollout first: it uses the workers
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.close()
        self.cluster.close()


def _prompt_lines(config: GRPOConfig, setup: TaskSetup) -> list[str]:
    """Start-up lines: whether prompts go through a chat template, and the first one as tokens decode.

    The first prompt is the data source's first (a pure function of the position: no random draws).
    """
    if setup.use_chat_template:
        how = "prompts: chat template applied (model.path's tokenizer)"
    else:
        how = "prompts: plain text (no chat template)"
    first = setup.source.batch(0, 1)[0].prompt
    ids = encode_prompt(setup, first, max_tokens=2**62)  # too long fails in the step, naming the key
    shown = repr(setup.tokenizer.decode(ids, skip_special_tokens=False))
    if len(shown) > _PROMPT_SHOWN:
        shown = shown[: _PROMPT_SHOWN - 3] + "..."
    return [how, f"first prompt as the model sees it: {shown}"]


PROMPTS_FILE = "prompts.jsonl"  # asynchronous runs: {"step": s, "prompts": [data positions trained]}
_PROMPT_SHOWN = 160  # characters of the first prompt's repr on its start-up line


def _other_workers(config: GRPOConfig) -> str:
    """The start-up line's count of the non-actor workers."""
    resources = config.resources
    parts = [f"{resources.num_reward_workers} reward worker(s)"]
    if not resources.colocate and config.algorithm.kl_coef > 0:
        parts.append(f"{resources.reference_workers} reference worker(s)")
    if not resources.colocate and config.reward.models:
        parts.append(f"{resources.reward_model_workers} reward-model worker(s)")
    return " + ".join(parts)


def _shard(rank: RankInfo) -> int:
    """The model-parallel shard a rank holds (its TP x PP position; DP replicas share it)."""
    return rank.pp_rank * rank.tp_size + rank.tp_rank
