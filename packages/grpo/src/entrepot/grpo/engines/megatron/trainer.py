"""One actor rank's megatron-core policy: model chunks under DDP, optimizer, LR schedule, reference.

Data: every rank of a model-parallel group (same DP rank) holds the same rows (the group reads the
dock once and broadcasts). A pass cuts them into micro-batches under the pass's token budget and
runs them through megatron's forward-backward schedule (1F1B or interleaved under PP); each
micro-batch is a right-padded [b, L] grid with causal attention (megatron's local attention takes
no packed sequences), and the LM head's vocab-parallel logits are scored at response positions.

Loss: the same `policy_loss` as the torch engine with token weights normalised over the global
mini-batch, so megatron runs with `calculate_per_token_loss` (no division by the micro-batch
count) and its gradient finalisation sums, not averages, over DP ranks. Gradients are clipped by
megatron's optimizer over the whole model (norms reduced over TP and PP, not a local norm).

Legend: B rows, R response tokens, L longest row of a micro-batch, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from entrepot.grpo.algo.losses import loss_normalizer
from entrepot.grpo.algo.sequences import ResponseBatch, segment_index
from entrepot.grpo.algo.update import (
    DataParallel,
    UpdateInputs,
    micro_batch_loss,
    micro_batches,
    process_group_backend,
)
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.embedded.gpt2_model import hf_architecture
from entrepot.grpo.engines.frozen import FrozenOnDemand
from entrepot.grpo.engines.megatron.vocab_parallel import vocab_parallel_logprobs
from entrepot.grpo.engines.rendezvous import free_local_port
from entrepot.grpo.errors import GRPOConfigError

__all__ = ["MegatronTrainer", "init_model_parallel"]

_METRIC_KEYS = ("pg_loss", "clip_frac", "ratio_mean", "entropy", "kl")


def init_model_parallel(config: GRPOConfig, rank: int, world_size: int, dist_init: str) -> None:
    """torch.distributed (gloo on CPU; NCCL for GPU tensors) and megatron-core's parallel state."""
    from entrepot.resharding.engines.megatron import require_megatron
    from entrepot.resharding.engines.megatron_cpu import enable_cpu_mode

    require_megatron()
    device = torch.device(config.engine.device)
    enable_cpu_mode(device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    if not dist.is_initialized():
        init = dist_init or f"tcp://127.0.0.1:{free_local_port()}"
        backend = process_group_backend(device)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size)
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    train = config.parallel.train
    vpp = train.virtual_pipeline if (train.virtual_pipeline or 1) > 1 else None
    mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=train.tensor,
        pipeline_model_parallel_size=train.pipeline,
        virtual_pipeline_model_parallel_size=vpp,
    )
    model_parallel_cuda_manual_seed(config.seed)


def _check_model_fits(config: GRPOConfig, hf_config: Any, vocab_size: int) -> None:
    """Refuse a layout the model cannot take, naming the key (a local model's shape is known only now)."""
    train = config.parallel.train
    heads = getattr(hf_config, "num_attention_heads", None) or hf_config.n_head
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    layers = getattr(hf_config, "num_hidden_layers", None) or hf_config.n_layer
    stages = train.pipeline * (train.virtual_pipeline or 1)
    problems = [
        (heads % train.tensor, f"a divisor of the model's attention heads ({heads})"),
        (groups % train.tensor, f"a divisor of the model's KV heads ({groups})"),
        (vocab_size % train.tensor, f"a divisor of the vocabulary size ({vocab_size})"),
    ]
    for bad, allowed in problems:
        if bad:
            raise GRPOConfigError(f"parallel.train.tensor ({train.tensor}) must be {allowed}")
    if layers % stages:
        raise GRPOConfigError(
            f"parallel.train.pipeline ({train.pipeline}) x virtual_pipeline ({train.virtual_pipeline}) "
            f"must divide the model's layers ({layers})"
        )


def _weights_of(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """An HF model's state dict, detached (what the adaptor converts to the training layout)."""
    return {n: p.detach() for n, p in hf_model.state_dict().items()}


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
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        from entrepot.resharding.adaptors import get_adaptor
        from entrepot.resharding.engines.megatron import MegatronTrainingEngine
        from entrepot.resharding.engines.megatron_model import gpt_model_chunks, transformer_config

        self.config = config
        self.device = torch.device(config.engine.device)
        hf_config: Any = hf_model.config
        _check_model_fits(config, hf_config, int(hf_config.vocab_size))
        train = config.parallel.train
        self.tconfig = transformer_config(
            hf_config,
            cpu=self.device.type == "cpu",
            tensor_model_parallel_size=train.tensor,
            pipeline_model_parallel_size=train.pipeline,
            virtual_pipeline_model_parallel_size=train.virtual_pipeline if train.pipeline > 1 else None,
        )
        if self.tconfig.virtual_pipeline_model_parallel_size:
            # With VPP, a stage's previous and next stage can be one peer (PP 2): the shape messages
            # megatron sends for variable lengths then cross (a hang on gloo). Fixed shapes send none.
            self.tconfig.variable_seq_lengths = False
        # Our loss is normalised over the global mini-batch: gradients are summed, never rescaled.
        self.tconfig.finalize_model_grads_func = functools.partial(_finalize_summing, finalize_model_grads)
        self.adaptor = get_adaptor(hf_architecture(hf_model), hf_config)
        full = self.adaptor.hf_to_train(_weights_of(hf_model))
        chunks = self._loaded_chunks(gpt_model_chunks(hf_config, self.tconfig), full)
        self.reference: list[torch.nn.Module] | None = None
        reference_params: list[torch.Tensor] = []
        if config.algorithm.kl_coef > 0:
            ref_full = full if reference is None else self.adaptor.hf_to_train(_weights_of(reference))
            self.reference = [
                c.requires_grad_(False).eval()
                for c in self._loaded_chunks(gpt_model_chunks(hf_config, self.tconfig), ref_full)
            ]
            reference_params = [p for c in self.reference for p in c.parameters()]
        # host memory between its uses (engine.offload_reference)
        self.frozen_reference = FrozenOnDemand(reference_params, offload=config.engine.reference_offloaded)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                   use_distributed_optimizer=False)  # fmt: skip
        self.chunks: list[torch.nn.Module] = [
            DistributedDataParallel(self.tconfig, ddp_config, chunk) for chunk in chunks
        ]
        self.optimizer = _optimizer(config, self.chunks)
        self.scheduler = _scheduler(config, self.optimizer)
        self.train_engine = MegatronTrainingEngine(self.chunks)
        self.dp = DataParallel(mpu.get_data_parallel_group())
        self.is_last_stage = mpu.is_pipeline_last_stage(ignore_virtual=True)
        self.tp_rank = mpu.get_tensor_model_parallel_rank()

    # -- setup ---------------------------------------------------------------------------------

    def _loaded_chunks(self, chunks: list[torch.nn.Module], full: dict[str, torch.Tensor]) -> list[Any]:
        """Move `chunks` to the device and copy this rank's shard of `full` into them."""
        from megatron.core import parallel_state as mpu

        from entrepot.resharding.engines.megatron import MegatronTrainingEngine
        from entrepot.resharding.engines.torch import copy_weights_in_place

        chunks = [chunk.to(self.device) for chunk in chunks]
        engine = MegatronTrainingEngine(chunks)
        shard = self.adaptor.shard(
            full, engine.layout, tp_rank=mpu.get_tensor_model_parallel_rank(),
            pp_rank=mpu.get_pipeline_model_parallel_rank(),
        )  # fmt: skip
        copy_weights_in_place(engine.named_train_parameters(), shard)
        for chunk in chunks:  # the last stage's copy of tied embeddings follows the first stage's
            chunk.setup_embeddings_and_output_layer()  # type: ignore[operator]
        return chunks

    # -- passes --------------------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, batch: ResponseBatch, pass_name: str, *, reference: bool) -> torch.Tensor | None:
        """Log-probs [R] of the response tokens on the last pipeline stage (None on the others)."""
        model = self.reference if reference else self.chunks
        if model is None:
            raise RuntimeError("reference log-probs asked for but algorithm.kl_coef == 0")
        plan = self._plan(batch.lengths, pass_name)
        for chunk in model:
            chunk.eval()

        def score(micro: _Micro, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            logp, _ = vocab_parallel_logprobs(micro.scored(logits), micro.labels, with_entropy=False)
            return logp.sum() * 0, torch.tensor(1), {"logp": logp.float().cpu()}

        with self.reference_resident() if reference else contextlib.nullcontext():
            outputs = self._schedule(model, batch, plan, score, forward_only=True)
        if not self.is_last_stage:
            return None
        out = torch.empty(batch.num_response_tokens, dtype=torch.float32)
        for rows, result in zip(plan, outputs, strict=True):
            out[segment_index(batch.response_lengths, rows)] = result["logp"]
        return out

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        """PPO-clip epochs over the mini-batches (one optimiser step each); mean diagnostics."""
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
        counts = torch.tensor(
            [loss_normalizer(mini.response_lengths, algo.loss_agg), mini.num_response_tokens],
            dtype=torch.float64,
        )
        self.dp.sum_(counts)
        normalizer, num_tokens = float(counts[0]), float(counts[1])
        plan = self._plan(mini.lengths, "update", self.dp)

        def loss(micro: _Micro, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            picked = rows[micro.rows]
            logp, entropy = vocab_parallel_logprobs(
                micro.scored(logits), micro.labels, with_entropy=True, entropy_grad=algo.entropy_coef > 0
            )
            out = micro_batch_loss(inputs, picked, micro.batch, logp, entropy, algo, normalizer, num_tokens)
            return out.loss, torch.tensor(1), dict(out.metrics)

        for chunk in self.chunks:
            chunk.zero_grad_buffer()  # type: ignore[operator]
        self.optimizer.zero_grad()
        outputs = self._schedule(self.chunks, mini, plan, loss, forward_only=False)
        if not plan:  # no row of this mini-batch here: still join the DP gradient sum
            _finalize_summing(None, self.chunks)
        _, grad_norm, _ = self.optimizer.step()
        metrics = self._step_metrics(outputs, inputs.ref_logp is not None)
        metrics["grad_norm"] = float(grad_norm) if grad_norm is not None else 0.0
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["micro_batches"] = float(len(plan))
        return metrics

    def _step_metrics(self, outputs: list[dict[str, Any]], with_kl: bool) -> dict[str, float]:
        """Diagnostics summed over micro-batches and DP ranks, sent from the last stage to the others."""
        from megatron.core import parallel_state as mpu

        keys = [k for k in _METRIC_KEYS if with_kl or k != "kl"]
        sums = torch.zeros(len(keys) + 1, dtype=torch.float64)
        for out in outputs:
            sums[:-1] += torch.tensor([float(out[k]) for k in keys], dtype=torch.float64)
            sums[-1] = max(float(sums[-1]), float(out["ratio_max"]))
        if mpu.get_pipeline_model_parallel_world_size() > 1:  # only the last stage computed a loss
            dist.all_reduce(sums, group=mpu.get_pipeline_model_parallel_group())
        ratio_max = torch.tensor([max(float(sums[-1]), 1.0)])
        self.dp.sum_(sums[:-1])
        dist.all_reduce(ratio_max, op=dist.ReduceOp.MAX, group=self.dp.group)
        return {**dict(zip(keys, sums[:-1].tolist(), strict=True)), "ratio_max": float(ratio_max)}

    def _plan(
        self, lengths: torch.Tensor, pass_name: str, dp: DataParallel | None = None
    ) -> list[torch.Tensor]:
        """Row indexes of each micro-batch of a pass (none empty).

        The interleaved (VPP) schedule runs micro-batches in groups of PP: with VPP the largest
        micro-batches are halved until their count is a multiple of PP.
        """
        plan = [m for m in micro_batches(lengths, self.config.batching, pass_name, dp) if m.numel()]
        pp = self.tconfig.pipeline_model_parallel_size
        if not self.tconfig.virtual_pipeline_model_parallel_size or not plan:
            return plan
        while len(plan) % pp:
            largest = max(range(len(plan)), key=lambda i: len(plan[i]))
            if len(plan[largest]) < 2:
                raise GRPOConfigError(
                    f"parallel.train.virtual_pipeline: the interleaved schedule needs a multiple of "
                    f"parallel.train.pipeline ({pp}) micro-batches, and this pass has {len(plan)} rows; "
                    f"use more rows per step or no virtual pipeline"
                )
            half = len(plan[largest]) // 2
            plan[largest : largest + 1] = [plan[largest][:half], plan[largest][half:]]
        return plan

    def _schedule(
        self, model: list[torch.nn.Module], batch: ResponseBatch, plan: Sequence[torch.Tensor],
        score: Any, *, forward_only: bool,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Run `plan`'s micro-batches through megatron's forward-backward schedule."""
        if not plan:
            return []
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = [_Micro(batch, rows) for rows in plan]
        width = max(int(m.batch.lengths.max()) for m in micros)
        # With VPP megatron exchanges fixed shapes (see `__init__`): every
        # micro-batch is padded to the pass's widest one, with all-pad rows where it has fewer.
        rows = max(m.batch.num_rows for m in micros) if not self.tconfig.variable_seq_lengths else None

        def forward_step(data: Iterator[_Micro], chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
            micro = next(data)
            tokens, positions = micro.grid(self.device, None if rows is None else (rows, width))
            logits = chunk(tokens, positions, attention_mask=None)
            return logits, functools.partial(score, micro)

        iterators: Any = [iter(micros) for _ in model] if len(model) > 1 else iter(micros)
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iterators, model=model, forward_only=forward_only,
            num_microbatches=len(micros), seq_length=width, micro_batch_size=rows or 1,
        )  # fmt: skip
        return list(outputs)

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


class _Micro:
    """One micro-batch: its rows of the pass's batch, the padded grid and the scored positions."""

    def __init__(self, batch: ResponseBatch, rows: torch.Tensor) -> None:
        self.rows = rows
        self.batch = batch.select(rows)
        keep = self.batch.predicting_positions()  # [R] flat positions scored
        self.labels = self.batch.tokens[keep + 1]  # [R]
        starts = torch.cumsum(self.batch.lengths, 0) - self.batch.lengths
        self.row = torch.repeat_interleave(torch.arange(self.batch.num_rows), self.batch.response_lengths)
        self.column = keep - starts[self.row]  # [R] position inside its row

    def grid(
        self, device: torch.device, shape: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded tokens [b, L] and positions [b, L] (pads are never attended to by real tokens).

        `shape`: pad to this [b, L] instead (extra rows are all padding and never scored).
        """
        tokens, _ = self.batch.padded(pad_token_id=0)
        if shape is not None:
            extra_rows, extra_columns = shape[0] - tokens.shape[0], shape[1] - tokens.shape[1]
            tokens = torch.nn.functional.pad(tokens, (0, extra_columns, 0, extra_rows))
        positions = torch.arange(tokens.shape[1]).expand_as(tokens).contiguous()
        return tokens.to(device), positions.to(device)

    def scored(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, L, V / TP] -> [R, V / TP] at the positions that predict response tokens."""
        return logits[self.row.to(logits.device), self.column.to(logits.device)]


def _finalize_summing(finalize: Any, model: list[torch.nn.Module], *args: Any, **kwargs: Any) -> None:
    """megatron's gradient finalisation (DP all-reduce, tied-embedding sync) without token rescaling."""
    if finalize is None:
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        finalize = finalize_model_grads
    finalize(model, None)


def _optimizer(config: GRPOConfig, chunks: list[torch.nn.Module]) -> Any:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    algo = config.algorithm
    return get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=algo.lr, weight_decay=algo.weight_decay,
            adam_beta1=algo.adam_betas[0], adam_beta2=algo.adam_betas[1], adam_eps=1e-8,
            # no clipping is a threshold never reached: megatron then still reports the norm
            clip_grad=algo.grad_clip if algo.grad_clip is not None else 1e30,
            bf16=False, fp16=False, params_dtype=torch.float32, use_distributed_optimizer=False,
        ),
        chunks,
    )  # fmt: skip


def _scheduler(config: GRPOConfig, optimizer: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """The torch engine's LR schedule on the torch optimizer inside megatron's."""
    from entrepot.grpo.algo.optim import lr_lambda
    from entrepot.grpo.engines.policy import total_optimizer_steps

    inners = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    if len(inners) != 1 or not isinstance(inners[0], torch.optim.Optimizer):
        raise RuntimeError(f"expected one torch optimizer inside megatron's, found {inners}")
    inner = inners[0]
    algo = config.algorithm
    schedule = functools.partial(
        lr_lambda, warmup_steps=algo.warmup_steps, total_steps=total_optimizer_steps(config),
        schedule=algo.lr_schedule,
    )  # fmt: skip
    return torch.optim.lr_scheduler.LambdaLR(inner, schedule)


def _unwrapped(chunk: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(chunk, "module", chunk)
    return inner if isinstance(inner, torch.nn.Module) else chunk
