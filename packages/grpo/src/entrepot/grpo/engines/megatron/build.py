"""What a megatron actor rank trains with: the layout check, transformer config, chunks under DDP,
optimizer and LR schedule.

The pieces `MegatronTrainer` assembles, each from the sections it reads. Gradients are summed over
DP ranks, never averaged (`finalize_summing`): the loss is normalised over the global mini-batch.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from entrepot.grpo.algo.optim import lr_lambda
from entrepot.grpo.config import AlgorithmConfig, TrainParallelConfig
from entrepot.grpo.errors import GRPOConfigError

__all__ = [
    "check_model_fits",
    "ddp_chunks",
    "finalize_summing",
    "loaded_chunks",
    "lr_scheduler",
    "megatron_optimizer",
    "training_transformer_config",
    "weights_of",
]


def check_model_fits(train: TrainParallelConfig, hf_config: Any, vocab_size: int) -> None:
    """Refuse a layout the model cannot take, naming the key (a local model's shape is known only now)."""
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


def training_transformer_config(train: TrainParallelConfig, hf_config: Any, device: torch.device) -> Any:
    """megatron's `TransformerConfig` of `hf_config` at `parallel.train`'s layout, summing gradients."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    from entrepot.resharding.engines.megatron_model import transformer_config

    tconfig = transformer_config(
        hf_config,
        cpu=device.type == "cpu",
        tensor_model_parallel_size=train.tensor,
        pipeline_model_parallel_size=train.pipeline,
        virtual_pipeline_model_parallel_size=train.virtual_pipeline if train.pipeline > 1 else None,
    )
    if tconfig.virtual_pipeline_model_parallel_size:
        # With VPP, a stage's previous and next stage can be one peer (PP 2): the shape messages
        # megatron sends for variable lengths then cross (a hang on gloo). Fixed shapes send none.
        tconfig.variable_seq_lengths = False
    # Our loss is normalised over the global mini-batch: gradients are summed, never rescaled.
    tconfig.finalize_model_grads_func = functools.partial(finalize_summing, finalize_model_grads)
    return tconfig


def weights_of(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """An HF model's state dict, detached (what the adaptor converts to the training layout)."""
    return {n: p.detach() for n, p in hf_model.state_dict().items()}


def loaded_chunks(
    chunks: list[torch.nn.Module], full: dict[str, torch.Tensor], adaptor: Any, device: torch.device
) -> list[Any]:
    """Move `chunks` to `device` and copy this rank's shard of `full` (training names) into them."""
    from megatron.core import parallel_state as mpu

    from entrepot.resharding.engines.megatron import MegatronTrainingEngine
    from entrepot.resharding.engines.torch import copy_weights_in_place

    chunks = [chunk.to(device) for chunk in chunks]
    engine = MegatronTrainingEngine(chunks)
    shard = adaptor.shard(
        full, engine.layout, tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
    )  # fmt: skip
    copy_weights_in_place(engine.named_train_parameters(), shard)
    for chunk in chunks:  # the last stage's copy of tied embeddings follows the first stage's
        chunk.setup_embeddings_and_output_layer()  # type: ignore[operator]
    return chunks


def ddp_chunks(tconfig: Any, chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """`chunks` under megatron's DDP (fp32 gradient buffers, no overlap, no distributed optimizer)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)  # fmt: skip
    return [DistributedDataParallel(tconfig, ddp_config, chunk) for chunk in chunks]


def finalize_summing(finalize: Any, model: list[torch.nn.Module], *args: Any, **kwargs: Any) -> None:
    """megatron's gradient finalisation (DP all-reduce, tied-embedding sync) without token rescaling."""
    if finalize is None:
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        finalize = finalize_model_grads
    finalize(model, None)


def megatron_optimizer(algo: AlgorithmConfig, chunks: list[torch.nn.Module]) -> Any:
    """megatron's fp32 Adam over `chunks`, clipping by the norm of the whole model."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

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


def lr_scheduler(
    optimizer: Any, algo: AlgorithmConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The torch engine's LR schedule on the torch optimizer inside megatron's.

    Args:
        optimizer: megatron's optimizer (one torch optimizer inside).
        algo: the `algorithm` section (warm-up, schedule).
        total_steps: optimiser steps of the whole run (`total_optimizer_steps`).
    """
    inners = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    if len(inners) != 1 or not isinstance(inners[0], torch.optim.Optimizer):
        raise RuntimeError(f"expected one torch optimizer inside megatron's, found {inners}")
    inner = inners[0]
    schedule = functools.partial(
        lr_lambda, warmup_steps=algo.warmup_steps, total_steps=total_steps, schedule=algo.lr_schedule,
    )  # fmt: skip
    return torch.optim.lr_scheduler.LambdaLR(inner, schedule)
