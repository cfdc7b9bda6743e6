"""The co-located actor worker: rollout, reward models, reference, old and teacher log-probs, the update.

One instance per rank of the actor group, all on one device. It holds a `Policy` (training model,
rollout engine, reference) and switches between them with entrepot.resharding's `ShardingManager`:
`enter_infer_mode` reshards train -> infer and loads the engine; train mode onloads what the update
needs. With `resources.colocate` it also holds the reward models; offloaded (`engine.offload_reference`,
`engine.offload_reward_models`), the reference and reward models are on the device only for their
stage. Each stage reports its peak memory (`memory/<phase>_peak_bytes`), reads its rows from the dock
packed and writes back flat outputs with their lengths (responses, per-token log-probs): no padding.
With several DP ranks, ref/old log-prob ranks share the rows (whoever asks takes the next ones);
the update takes exactly the rows the driver planned for each rank and sums gradients over ranks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.dock import DockClient
from entrepot.grpo.agents import build_rollout
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.config.correction import resolve as resolve_correction
from entrepot.grpo.data.lengths import partial_max_age
from entrepot.grpo.embedded.threads import configure_threads, use_deterministic_kernels
from entrepot.grpo.engines.frozen import device_bytes
from entrepot.grpo.engines.policy import Policy, build_policy
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.errors import LogpMismatchError
from entrepot.grpo.evaluation.runner import EvalRecord, EvalSettings, evaluate_samples
from entrepot.grpo.evaluation.summary import in_run_metrics
from entrepot.grpo.run.deployment import uses_ray
from entrepot.grpo.workers._inspection import ActorInspection
from entrepot.grpo.workers._memory import PhaseMemory, Sample
from entrepot.grpo.workers._model_rewards import MODEL_STAGE, ModelRewards
from entrepot.grpo.workers._rollout import (
    LogpMismatch,
    full_rollout,
    multiturn_rollout,
    partial_rollout,
    reshard_metrics,
)
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS, DockReader, stage
from entrepot.grpo.workers._teacher import Teacher, TeacherStage
from entrepot.grpo.workers._update_inputs import response_batch, update_columns, update_inputs
from entrepot.grpo.workers._weight_out import WeightOut
from entrepot.grpo.workers.ranks import RankInfo

if TYPE_CHECKING:
    from entrepot.grpo.data.tasks import Sample as PromptSample
    from entrepot.grpo.engines.weight_sync import PublishedWeights

__all__ = ["ActorWorker"]


class ActorWorker(ActorInspection, TeacherStage):
    """One rank of the co-located actor.

    Args:
        config: the run's config (the dataclass itself; it crosses Ray as it is).
        rank: this worker's coordinates in the actor group.
        dist_init: ``tcp://host:port`` of torch.distributed when the group has several ranks.
        run_dir: the run directory (vLLM's model directory goes there); None: a temporary one.
    """

    role = "actor"

    def __init__(
        self,
        config: GRPOConfig,
        rank: RankInfo | None = None,
        dist_init: str = "",
        run_dir: str | None = None,
    ) -> None:
        configure_threads(config.threads, interop=True)
        if config.engine.deterministic:
            use_deterministic_kernels()
        self.config = config
        self.rank = rank or RankInfo(rank=0, world_size=1)
        # the process groups first (megatron: its parallel state; torch: the DP group)
        engines = choose_engines(config.engine)
        me = self.rank
        group = engines.train.start(config, me.rank, me.world_size, me.model_parallel_size, dist_init)
        self.reader = DockReader(self.rank, config.resources.stage_timeout_s, group)
        # the rollout samples from one sampling stream that every rank advances alike (see
        # `_rollout.batch_generator`), whether each rank generates alone or a TP vLLM's ranks together
        on_ray = uses_ray(config.resources, config.parallel, config.dock)
        self.policy: Policy = build_policy(config, run_dir, on_ray=on_ray)
        self.trainer = self.policy.trainer
        if self.rank.world_size > 1:
            self.trainer.join_data_parallel()
        self._exit_infer_s = 0.0
        self.model_rewards: ModelRewards | None = None
        if config.reward.models and config.resources.colocate:
            self.model_rewards = ModelRewards(
                config.reward, self.policy.setup.tokenizer, device=config.engine.device,
                group_size=config.rollout.n_samples_per_prompt, offload=config.engine.reward_models_offloaded,
            )  # fmt: skip
        self._tracked_params: list[torch.Tensor] | None = None
        self.weights_out = WeightOut(self.policy, self.rank.rank, f"actor {self.rank.name}",
                                     config.trainer.weight_sync_timeout_s)  # fmt: skip
        self.memory = PhaseMemory(config.engine.device, self._device_bytes)
        self.multiturn = build_rollout(config.multiturn, self.policy.setup.tokenizer)
        self.teacher = Teacher.build(config)  # algorithm.distill.teacher, or None

    def _parameters(self) -> list[torch.Tensor]:
        """The training parameters, listed once (they keep their identity; offloading empties them)."""
        if self._tracked_params is None:
            self._tracked_params = list(self.trainer.named_parameters().values())
        return self._tracked_params

    def _device_bytes(self) -> int:
        """Bytes of model state on the device now: training state, rollout weights, reference, rewards.

        Gradients and optimizer state come and go, and are listed on each call.
        """
        params = self._parameters()
        grads = [g for p in params for g in (getattr(p, "grad", None), getattr(p, "main_grad", None))
                 if isinstance(g, torch.Tensor)]  # fmt: skip
        optim = [v for state in self.trainer.torch_optimizer.state.values() for v in state.values()
                 if isinstance(v, torch.Tensor)]  # fmt: skip
        rewards = list(self.model_rewards.params()) if self.model_rewards is not None else []
        rewards += self.teacher.frozen.params if self.teacher is not None else []
        frozen = device_bytes([*params, *grads, *optim, *self.trainer.frozen_reference.params, *rewards])
        return frozen + int(self.policy.engine.resident_bytes())

    @property
    def _writes(self) -> bool:
        """Whether this rank puts the group's log-probs (the last pipeline stage's first TP rank)."""
        return bool(self.trainer.is_last_stage and self.trainer.tp_rank == 0)

    @property
    def _rollout_logprobs(self) -> bool:
        """Whether a whole-response rollout puts its log-probs in the dock: an engine of its own
        kernels (the old-log-prob stage compares them), or an off-policy correction asked for."""
        correction = resolve_correction(self.config.algorithm.correction, self.config.trainer.asynchronous)
        return self.policy.engines.rollout.separate_kernels or correction.active

    @property
    def _pad(self) -> int:
        return int(self.policy.setup.tokenizer.pad_token_id)

    # -- stages ---------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Nothing: answering at all means the worker finished starting (Ray queues calls until then)."""
        return True

    def rollout_engine(self) -> str:
        """The start-up line naming this rank's rollout engine (`engines.registry.rollout_description`)."""
        from entrepot.grpo.engines.registry import rollout_description
        from entrepot.grpo.engines.rollout_dtype import resolved_rollout_dtype

        dtype = resolved_rollout_dtype(self.config)
        return rollout_description(self.config.engine, self.policy.architecture, dtype)

    @stage("actor_rollout")
    def rollout(self, dock: DockClient, count: int, version: int = 0) -> dict[str, float]:
        """Reshard into the engine, generate responses (`count` rows a get), put them in the dock.

        With `rollout.partial_max_tokens`, one round of partial rollout by policy `version` instead.
        """
        stats: dict[str, float] = {}
        with self.memory.phase("rollout", stats) as sample:
            stats.update(self._rollout(dock, count, sample, version))
        return stats

    def _rollout(self, dock: DockClient, count: int, sample: Sample, version: int) -> dict[str, float]:
        policy = self.policy
        t0 = time.perf_counter()
        sample(policy.manager.enter_infer_mode())
        t1 = time.perf_counter()
        train_bytes = device_bytes(self._parameters())  # held while generating
        base = (
            int(torch.randint(2**62, (1,), generator=policy.generator)) if self.rank.world_size > 1 else None
        )
        cfg = self.config
        if self.multiturn is not None:
            stats = multiturn_rollout(policy, self.multiturn, self.reader, dock, count, version=version,
                                      n=cfg.rollout.n_samples_per_prompt, base=base)  # fmt: skip
        elif cfg.rollout.partial_max_tokens is not None:
            stats = partial_rollout(policy, self.reader, dock, count, base=base, version=version,
                                    partial_max_tokens=cfg.rollout.partial_max_tokens,
                                    max_age=partial_max_age(cfg.data, cfg.rollout))  # fmt: skip
        else:
            stats = full_rollout(policy, self.reader, dock, count, n=cfg.rollout.n_samples_per_prompt,
                                 base=base, alone=cfg.parallel.infer.tensor == 1,
                                 puts=self.rank.reads_dock, logprobs=self._rollout_logprobs)  # fmt: skip
        t2 = time.perf_counter()
        sample()
        policy.manager.exit_infer_mode()
        self._exit_infer_s = time.perf_counter() - t2
        return {
            **stats,
            "time/reshard_to_infer": t1 - t0,
            "time/generate": t2 - t1,
            "memory/train_param_bytes_in_rollout": float(train_bytes),
            **reshard_metrics(policy.reshard_stats),
        }

    @stage(MODEL_STAGE)
    def reward_model_scores(self, dock: DockClient, count: int) -> dict[str, float]:
        """Co-located reward models: score responses (`count` rows a get) into `model_scores`.

        Each model is on the device only while it scores (when offloaded). In a model-parallel group
        the first rank of each replica scores (every rank holds the whole reward models).
        """
        if self.model_rewards is None or not self.rank.reads_dock:
            return {}
        stats: dict[str, float] = {}
        with self.memory.phase("reward_model", stats) as sample:
            stats.update(self.model_rewards.run_stage(self.reader, dock, count, sample=sample))
        return stats

    @stage("ref_log_prob")
    def reference_logprobs(
        self, dock: DockClient, count: int, rows: Sequence[int] | None = None
    ) -> dict[str, float]:
        """Reference log-probs of response tokens (flat, per row) into the dock, `count` rows at a time
        (of `rows` only, when given: asynchronous training's step).

        The reference is onloaded once for the stage and offloaded after it (engine.offload_reference).
        """
        t0 = time.perf_counter()
        stats: dict[str, float] = {}
        with self.memory.phase("ref_log_prob", stats) as sample, self.trainer.reference_resident():
            sample()
            self._log_probs(dock, "ref_log_prob", "ref_log_prob", count, reference=True, rows=rows)
        stats["time/ref"] = time.perf_counter() - t0
        return stats

    @stage("actor_log_prob")
    def old_logprobs(
        self, dock: DockClient, count: int, rows: Sequence[int] | None = None
    ) -> dict[str, float]:
        """Log-probs of the policy the update starts from (needed when the update takes several optimiser
        steps, or by the off-policy correction), `count` rows at a time (of `rows` only, when given).

        When the rollout engine returned its own log-probs (vLLM), also their distance to these:
        `rollout/logp_mismatch_mean` and `_max`; a mean above `engine.max_logp_mismatch` fails the step
        before the update (`LogpMismatchError`).
        """
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        mismatch = LogpMismatch() if self.policy.engines.rollout.separate_kernels else None
        with self.memory.phase("old_log_prob", metrics) as sample:
            sample(self.policy.manager.enter_forward_mode())
            self._log_probs(dock, "actor_log_prob", "old_log_prob", count, reference=False, mismatch=mismatch,
                            rows=rows)  # fmt: skip
            self.policy.manager.exit_forward_mode()
        metrics["time/old_logp"] = time.perf_counter() - t0
        if mismatch is not None:
            metrics.update(mismatch.metrics())
            self._check_mismatch(metrics)
        return metrics

    def _check_mismatch(self, metrics: dict[str, float]) -> None:
        limit = self.config.engine.max_logp_mismatch
        mean = metrics.get("rollout/logp_mismatch_mean")
        if limit is not None and mean is not None and mean > limit:
            raise LogpMismatchError(
                f"mean |log p_rollout - log p_train| of the sampled tokens is {mean:.3g} (max "
                f"{metrics['rollout/logp_mismatch_max']:.3g}), above engine.max_logp_mismatch ({limit:g}): "
                "the rollout engine does not compute with the trainer's weights"
            )

    def _log_probs(
        self, dock: DockClient, consumer: str, column: str, count: int, *, reference: bool,
        mismatch: LogpMismatch | None = None, rows: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        n = self.config.rollout.n_samples_per_prompt
        masked = mismatch is not None and self.config.multiturn.enabled  # the model's tokens only
        columns = [*SEQUENCE_COLUMNS, *(["rollout_log_prob"] if mismatch is not None else []),
                   *(["model_mask"] if masked else [])]  # fmt: skip
        for batch in self.reader.stage_batches(dock, consumer, columns, count, n, rows):
            sequences = response_batch(batch)
            logp = self.trainer.logprobs(sequences, column, reference=reference)
            if self._writes and logp is not None:  # the last pipeline stage computes them
                dock.put({column: (logp, sequences.response_lengths)}, batch.indexes)
                if mismatch is not None:
                    sampled = batch.columns["model_mask"].bool() if masked else slice(None)
                    mismatch.add(batch.columns["rollout_log_prob"][sampled], logp[sampled])

    @stage("actor_train")
    def update(
        self, dock: DockClient, plan: Sequence[Sequence[Sequence[int]]], *, with_old: bool,
        behaviour: bool = False,
    ) -> dict[str, float]:  # fmt: skip
        """The policy update on this rank's rows: `plan[dp_rank]` lists the dock rows of each mini-batch.

        `with_old`: the old-log-prob stage ran; `behaviour`: the rollout's log-probs are the ratio's
        old ones when it did not (partial rollout, asynchronous training).
        """
        t0 = time.perf_counter()
        cfg, policy = self.config, self.policy
        mine = plan[self.rank.dp_rank]
        columns = update_columns(
            cfg.algorithm, with_old=with_old, behaviour=behaviour, asynchronous=cfg.trainer.asynchronous,
            rollout_logprobs=self._rollout_logprobs, multiturn=cfg.multiturn.enabled,
        )  # fmt: skip
        rows = [row for mini in mine for row in mini]
        got = self.reader.take(dock, "actor_train", columns.columns, rows) if rows else None
        horizon = cfg.multiturn.max_tokens if cfg.multiturn.enabled else None
        inputs = update_inputs(got, mine, columns, cfg.algorithm, policy.sampling, horizon)
        memory: dict[str, float] = {}
        with self.memory.phase("update", memory) as sample:
            t_switch = time.perf_counter()
            sample(policy.manager.enter_train_mode())
            to_train = self._exit_infer_s + time.perf_counter() - t_switch
            metrics = self.trainer.update(inputs)
            sample()  # gradients and optimizer state now exist
            policy.manager.exit_train_mode()
        metrics.update(memory)
        if inputs.keep is not None and inputs.keep.numel():
            metrics["train/truncated_frac"] = float((~inputs.keep).float().mean())
        metrics["time/update"] = time.perf_counter() - t0
        metrics["time/reshard_to_train"] = to_train
        metrics["train_tokens"] = float(inputs.batch.lengths.sum()) if self.rank.reads_dock else 0.0
        return metrics

    def evaluate(self, num_prompts: int | None = None) -> dict[str, float]:
        """Greedy accuracy and reward on the first `num_prompts` (default ``eval.num_prompts``) held-out
        prompts: the in-run evaluation, the same `evaluate_records` as `rl eval`'s."""
        samples = self.policy.setup.source.held_out(num_prompts or self.config.eval.num_prompts)
        records = self.evaluate_records(samples, EvalSettings())
        return in_run_metrics(records, multiturn=self.multiturn is not None)

    def evaluate_records(
        self, samples: Sequence[PromptSample], settings: EvalSettings,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[EvalRecord]:  # fmt: skip
        """Every response to `samples` under `settings` (`rl eval`), with freshly resharded weights, as
        `evaluate` decodes its prompts."""
        with self.policy.manager.mode("infer"):
            return evaluate_samples(
                self.policy.engine, self.policy.setup, self.config.reward, samples, settings,
                max_prompt_tokens=self.config.data.max_prompt_tokens, multiturn=self.multiturn,
                on_progress=on_progress,
            )  # fmt: skip

    def publish_weights(self, version: int) -> PublishedWeights | None:
        """This rank's weights as `version` for the asynchronous rollout (`_weight_out.WeightOut`)."""
        return self.weights_out.publish(version)

    def send_weights(self, version: int, channel: str, secret: bytes) -> int:
        """Send them over the weight channel at `channel`, signed with the run's `secret` (Ray); the bytes
        sent (0 but on rank 0)."""
        return self.weights_out.send(version, channel, secret)

    def export_hf(self, directory: str) -> None:
        """Rank 0 writes the policy as an HF model directory (every rank joins the resharding)."""
        from entrepot.grpo.engines.policy import export_hf

        manager = self.policy.manager
        if not self.policy.engine.readable_weights:  # vLLM: its weights are kernel-packed
            weights = manager.resharder.reshard(manager.train_engine.named_train_parameters())
            if self.rank.rank == 0:
                export_hf(self.policy, directory, weights)
            return
        manager.enter_infer_mode()
        try:
            if self.rank.rank == 0:
                export_hf(self.policy, directory)
                self.trainer.save_adapter(Path(directory) / "adapter")  # LoRA: the adapter beside it
        finally:
            manager.exit_infer_mode()

    # -- checkpoint state and inspection --------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Model, reference, optimizer, scheduler and RNG state (tensors + JSON-able values)."""
        from entrepot.grpo.run.checkpoint import capture_state

        with self._all_state_resident():
            return capture_state(self.policy)

    def load_state(self, states: Sequence[dict[str, Any]]) -> None:
        """Restore `states[rank]` (one `state()` per rank, as a checkpoint reads them back)."""
        from entrepot.grpo.run.checkpoint import restore_state

        with self._all_state_resident():
            restore_state(self.policy, states[self.rank.rank])

    @contextlib.contextmanager
    def _all_state_resident(self) -> Iterator[None]:
        """Params, optimizer state and reference on the device (offloaded ones are 0-byte storages)."""
        with self.policy.manager.mode("train"), self.trainer.reference_resident():
            yield

    def shutdown(self) -> None:
        if self.rank.world_size > 1 or self.policy.engines.train.shards_weights:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
