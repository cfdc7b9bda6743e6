"""One actor rank's megatron-core policy: model chunks under DDP, optimizer, LR schedule, reference.

Data: a pass runs its rows' micro-batches through megatron's forward-backward schedule (`passes`);
the chunks, optimizer and schedule are built in `build`, the model-parallel world in `world`.

Loss: the same `policy_loss` as the torch engine with token weights normalised over the global
mini-batch, so megatron runs with `calculate_per_token_loss` (no division by the micro-batch
count) and its gradient finalisation sums, not averages, over DP ranks. Gradients are clipped by
megatron's optimizer over the whole model (norms reduced over TP and PP, not a local norm).

Legend: B rows, R response tokens, L longest row of a micro-batch, V vocabulary.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from entrepot.grpo.algo import correction as offpolicy
from entrepot.grpo.algo.optim import total_optimizer_steps
from entrepot.grpo.algo.sequences import ResponseBatch, segment_index
from entrepot.grpo.algo.update import DataParallel, UpdateInputs, micro_batch_loss, mini_batch_counts
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.embedded.gpt2_model import hf_architecture
from entrepot.grpo.engines.frozen import FrozenOnDemand
from entrepot.grpo.engines.megatron.build import (
    check_model_fits,
    ddp_chunks,
    finalize_summing,
    loaded_chunks,
    lr_scheduler,
    megatron_optimizer,
    training_transformer_config,
    weights_of,
)
from entrepot.grpo.engines.megatron.passes import MicroBatch, plan_micro_batches, run_schedule, step_metrics
from entrepot.grpo.engines.megatron.vocab_parallel import vocab_parallel_logprobs

__all__ = ["MegatronTrainer"]


class MegatronTrainer:
    """The training side of a megatron actor rank (call `init_model_parallel` first).

    Args:
        config: the run's config.
        hf_model: the policy in HF form (built from the config or loaded from `model.path`); its
            weights are converted to the training layout and this rank's shard is loaded.
        reference: the reference in HF form when it has its own weights (`model.ref_model_load_path`);
            None: the policy's initial weights.

    Attributes:
        chunks: the DDP-wrapped `GPTModel` chunk(s) of this rank (one per virtual stage).
        reference: frozen chunks with the initial weights, or None without a KL term.
        optimizer: megatron's optimizer (fp32 AdamW, clipping over the whole model).
        scheduler: the LR schedule (warm-up, constant or cosine) on the optimizer's param groups.
        train_engine: `entrepot.resharding`'s view of the chunks for resharding (global names).
    """

    def __init__(
        self, config: GRPOConfig, hf_model: torch.nn.Module, reference: torch.nn.Module | None = None
    ) -> None:
        from megatron.core import parallel_state as mpu

        from entrepot.resharding.adaptors import get_adaptor
        from entrepot.resharding.engines.megatron import MegatronTrainingEngine
        from entrepot.resharding.engines.megatron_model import gpt_model_chunks

        self.config = config
        self.device = torch.device(config.engine.device)
        hf_config: Any = hf_model.config
        check_model_fits(config.parallel.train, hf_config, int(hf_config.vocab_size))
        self.tconfig = training_transformer_config(config.parallel.train, hf_config, self.device)
        self.adaptor = get_adaptor(hf_architecture(hf_model), hf_config)
        full = self.adaptor.hf_to_train(weights_of(hf_model))
        chunks = loaded_chunks(gpt_model_chunks(hf_config, self.tconfig), full, self.adaptor, self.device)
        self.reference: list[torch.nn.Module] | None = None
        reference_params: list[torch.Tensor] = []
        if config.algorithm.kl_coef > 0:
            ref_full = full if reference is None else self.adaptor.hf_to_train(weights_of(reference))
            ref_chunks = gpt_model_chunks(hf_config, self.tconfig)
            self.reference = [
                c.requires_grad_(False).eval()
                for c in loaded_chunks(ref_chunks, ref_full, self.adaptor, self.device)
            ]
            reference_params = [p for c in self.reference for p in c.parameters()]
        # host memory between its uses (engine.offload_reference)
        self.frozen_reference = FrozenOnDemand(reference_params, offload=config.engine.reference_offloaded)
        self.chunks: list[torch.nn.Module] = ddp_chunks(self.tconfig, chunks)
        self.optimizer = megatron_optimizer(config.algorithm, self.chunks)
        total_steps = total_optimizer_steps(config.max_steps, config.algorithm, config.rollout)
        self.scheduler = lr_scheduler(self.optimizer, config.algorithm, total_steps)
        self.train_engine = MegatronTrainingEngine(self.chunks)
        self.dp = DataParallel(mpu.get_data_parallel_group())
        self.is_last_stage = mpu.is_pipeline_last_stage(ignore_virtual=True)
        self.tp_rank = mpu.get_tensor_model_parallel_rank()

    # -- passes --------------------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(
        self, batch: ResponseBatch, pass_name: str, *, reference: bool, temperature: float = 1.0
    ) -> torch.Tensor | None:
        """Log-probs [R] of the response tokens on the last pipeline stage (None on the others)."""
        assert temperature == 1.0, "the config refuses distillation (its temperature) with megatron"
        model = self.reference if reference else self.chunks
        if model is None:
            raise RuntimeError("reference log-probs asked for but algorithm.kl_coef == 0")
        plan = plan_micro_batches(batch.lengths, self.config.batching, self.tconfig, pass_name)
        for chunk in model:
            chunk.eval()

        def score(
            micro: MicroBatch, logits: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            logp, _ = vocab_parallel_logprobs(micro.scored(logits), micro.labels, with_entropy=False)
            return logp.sum() * 0, torch.tensor(1), {"logp": logp.float().cpu()}

        with self.reference_resident() if reference else contextlib.nullcontext():
            outputs = run_schedule(
                model, batch, plan, score, tconfig=self.tconfig, device=self.device, forward_only=True
            )
        if not self.is_last_stage:
            return None
        out = torch.empty(batch.num_response_tokens, dtype=torch.float32)
        for rows, result in zip(plan, outputs, strict=True):
            out[segment_index(batch.response_lengths, rows)] = result["logp"]
        return out

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        """Policy-loss epochs over the mini-batches (one optimiser step each); mean diagnostics."""
        totals: dict[str, float] = {}
        steps = 0
        for chunk in self.chunks:
            chunk.train()
        for _ in range(self.config.algorithm.epochs):
            for rows in inputs.mini_batches:
                for key, value in self._mini_batch_step(inputs, rows).items():
                    totals[key] = totals.get(key, 0.0) + value
                self.scheduler.step()
                steps += 1
        return {key: value / max(steps, 1) for key, value in totals.items()}

    def _mini_batch_step(self, inputs: UpdateInputs, rows: torch.Tensor) -> dict[str, float]:
        algo = self.config.algorithm
        mini = inputs.batch.select(rows)
        normalizer, num_tokens = mini_batch_counts(inputs, rows, algo, self.dp)
        plan = plan_micro_batches(mini.lengths, self.config.batching, self.tconfig, "update", self.dp)

        def loss(
            micro: MicroBatch, logits: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            picked = rows[micro.rows]
            logp, entropy = vocab_parallel_logprobs(
                micro.scored(logits), micro.labels, with_entropy=True, entropy_grad=algo.entropy_coef > 0
            )
            out = micro_batch_loss(inputs, picked, micro.batch, logp, entropy, algo, normalizer, num_tokens)
            return out.loss, torch.tensor(1), dict(out.metrics)

        for chunk in self.chunks:
            chunk.zero_grad_buffer()  # type: ignore[operator]
        self.optimizer.zero_grad()
        outputs = run_schedule(
            self.chunks, mini, plan, loss, tconfig=self.tconfig, device=self.device, forward_only=False
        )
        if not plan:  # no row of this mini-batch here: still join the DP gradient sum
            finalize_summing(None, self.chunks)
        _, grad_norm, _ = self.optimizer.step()
        metrics = step_metrics(outputs, inputs.ref_logp is not None, self.dp)
        if inputs.corrected:  # the same on every rank: the config and the rows' columns decide it
            metrics.update(_offpolicy_metrics(outputs, self.dp))
        metrics["grad_norm"] = float(grad_norm) if grad_norm is not None else 0.0
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["micro_batches"] = float(len(plan))
        return metrics

    # -- state ---------------------------------------------------------------------------------

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's trainable parameters under global training names (no tied copy)."""
        return self.train_engine.named_train_parameters()

    def reference_resident(self) -> contextlib.AbstractContextManager[None]:
        """The reference on the device inside the block; back in host memory after (offload_reference)."""
        return self.frozen_reference.resident()

    def named_reference(self) -> dict[str, torch.Tensor]:
        """This rank's reference parameters under global training names."""
        from entrepot.resharding.engines.megatron import MegatronTrainingEngine

        return (
            {} if self.reference is None else MegatronTrainingEngine(self.reference).named_train_parameters()
        )

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The torch AdamW inside megatron's optimizer (its moments are what checkpoints keep)."""
        return self.scheduler.optimizer

    def after_restore(self) -> None:
        """The last stage's copy of tied embeddings follows the restored first-stage weights."""
        for chunks in (self.chunks, self.reference or []):
            for chunk in chunks:
                _unwrapped(chunk).setup_embeddings_and_output_layer()  # type: ignore[operator]

    def join_data_parallel(self) -> None:
        """Nothing to do: megatron's DDP sums over its data-parallel group (`self.dp`) already."""

    def save_adapter(self, directory: object) -> bool:
        """No adapter: megatron trains every weight (`model.lora` is refused with it)."""
        return False


def _offpolicy_metrics(outputs: list[dict[str, Any]], dp: DataParallel) -> dict[str, float]:
    """The offpolicy/* diagnostics over micro-batches, pipeline stages and DP ranks, as `step_metrics`
    combines the others: the weighted sums summed, `is_weight_max` max-reduced like ratio_max."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    keys = offpolicy.METRIC_SUMS
    sums = torch.zeros(len(keys), dtype=torch.float64)
    top = torch.zeros(1, dtype=torch.float64)  # weights are >= 0; 0 where no token was scored
    for out in outputs:
        sums += torch.tensor([float(out[k]) for k in keys], dtype=torch.float64)
        top[0] = max(float(top[0]), float(out[offpolicy.METRIC_MAX]))
    if mpu.get_pipeline_model_parallel_world_size() > 1:  # only the last stage computed a loss
        dist.all_reduce(sums, group=mpu.get_pipeline_model_parallel_group())
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=mpu.get_pipeline_model_parallel_group())
    dp.sum_(sums)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=dp.group)
    return {**dict(zip(keys, sums.tolist(), strict=True)), offpolicy.METRIC_MAX: float(top[0])}


def _unwrapped(chunk: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(chunk, "module", chunk)
    return inner if isinstance(inner, torch.nn.Module) else chunk
