"""Section (a): one GRPO training step (fwd + bwd + optimiser) on a packed micro-batch, two engines.

- torch: HF's Qwen3 built from its config in bf16, attention over the packed row through
  `entrepot.batching.packed_causal_attention` (registered as an HF attention function), fp32
  master weights and AdamW (fused on CUDA), the GRPO policy loss.
- megatron: megatron-core's GPTModel (TP 1) built by `entrepot.resharding`'s recipe for the same
  config, bf16 with megatron's fp32-master optimizer and DDP grad buffers; the local layer spec
  with its core attention swapped for the same packed attention, taking the micro-batch as one
  packed row (megatron's THD format: RoPE per sequence), not a padded grid.

Both score the response tokens with the same chunked float32 log-softmax and `policy_loss`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
from collections.abc import Iterator
from typing import Any

import torch
from common import PackedBatch, Shape, grpo_internals, median, scored_logp, timed, train_flops

from entrepot.batching import packed_causal_attention
from entrepot.batching._attention import packed_attention_kernel

ATTENTION = "entrepot_bench_packed"
# The packed-attention backend of both engines: "auto" (the kernel this machine has), or "sdpa" when
# bench_gpu's attention check found that kernel broken (the table then says so).
BACKEND = {"name": "auto"}
LOGP_CHUNK = 4096  # scored rows per chunk of logits: 4096 x 151,936 x 4 bytes = 2.5 GB in float32
LR = 1e-6


def _hf_packed_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """HF attention over one packed row: [1, H, T, D] in, [1, T, H, D] out."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D]
    out = packed_causal_attention(
        q, k, v, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]), softmax_scale=scaling,
        backend=BACKEND["name"],  # type: ignore[arg-type]
    )  # fmt: skip
    return out.unsqueeze(0), None


def register_hf_attention() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _hf_packed_attention)
    AttentionMaskInterface.register(ATTENTION, lambda *args, **kwargs: None)  # cu_seqlens mask it


def build_hf_model(
    shape: Shape, device: torch.device, dtype: torch.dtype, *, packed: bool = True
) -> torch.nn.Module:
    """HF's Qwen3 of `shape` with random weights, built directly on `device` in `dtype`.

    `packed`: attend over packed rows (training, log-probs); else HF's SDPA (generation, padded batches).
    """
    from transformers import AutoModelForCausalLM

    register_hf_attention()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape.hf_config(), dtype=dtype, attn_implementation="sdpa")
    if packed:
        model.config._attn_implementation = ATTENTION
    return model


class MasterAdamW:
    """AdamW on fp32 master copies of bf16 parameters (what megatron's bf16 optimizer does).

    Gradients are clipped to norm 1 on the masters; the masters are copied back into the bf16
    parameters after each step. `param_groups` / `state` are the inner torch optimizer's, so an
    `entrepot.resharding.Offloader` moves the masters and the moments as optimizer state.
    """

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        self.params = params
        self.masters = [p.detach().float() for p in params]
        fused = params[0].device.type == "cuda"
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=0.0, fused=fused, foreach=not fused)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def step(self) -> None:
        for master, param in zip(self.masters, self.params, strict=True):
            master.grad = None if param.grad is None else param.grad.float()
        torch.nn.utils.clip_grad_norm_(self.masters, 1.0, foreach=True)
        self.inner.step()
        for master in self.masters:
            master.grad = None
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def hf_logp(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Log-probs [R] of the scored tokens: the decoder over the packed row, the LM head in chunks."""
    hidden = model.model(
        input_ids=batch.tokens[None], position_ids=batch.positions[None],
        cu_seq_lens_q=batch.cu_seqlens, cu_seq_lens_k=batch.cu_seqlens,
        max_length_q=batch.max_len, max_length_k=batch.max_len,
    ).last_hidden_state[0]  # [T, h]  # fmt: skip
    scored = hidden.index_select(0, batch.scored)  # [R, h]
    weight = model.lm_head.weight  # [V, h]
    return scored_logp(lambda a, b: scored[a:b] @ weight.T, batch.labels, LOGP_CHUNK)


def grpo_loss(logp: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    policy_loss = grpo_internals()["policy_loss"]
    loss: torch.Tensor = policy_loss(logp, batch.old_logp, batch.advantages, batch.weights).loss
    return loss


def torch_train_step(model: torch.nn.Module, optimizer: MasterAdamW, batch: PackedBatch) -> None:
    loss = grpo_loss(hf_logp(model, batch), batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _result(engine: str, shape: Shape, batch: PackedBatch, times: list[float], peak: float | None,
            extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    seconds = median(times)
    flops = train_flops(shape, batch.lengths, int(batch.scored.numel()))
    return {
        "engine": engine, "seconds_per_step": seconds, "step_times": times,
        "tokens_per_s": shape.tokens / seconds, "flops_per_step": flops, "flops_per_s": flops / seconds,
        "mfu_datasheet": None if peak is None else flops / seconds / peak, **extra,
    }  # fmt: skip


def bench_torch(shape: Shape, batch: PackedBatch, device: torch.device, *, warmup: int, repeat: int,
                peak: float | None) -> dict[str, Any]:  # fmt: skip
    model = build_hf_model(shape, device, torch.bfloat16)
    optimizer = MasterAdamW(list(model.parameters()), LR)
    kernel = packed_attention_kernel(torch.empty(1, 1, shape.head_dim, device=device, dtype=torch.bfloat16),
                                     batch.cu_seqlens, backend=BACKEND["name"])  # type: ignore[arg-type]  # fmt: skip
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = timed(lambda: torch_train_step(model, optimizer, batch), device, warmup=warmup, repeat=repeat)
    peak_bytes = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return _result(
        "torch", shape, batch, times, peak, {"attention_kernel": kernel, "peak_device_bytes": peak_bytes}
    )


# -- megatron-core ------------------------------------------------------------------------------


def _packed_core_attention_class() -> type:
    from megatron.core.transformer.module import MegatronModule

    class PackedCoreAttention(MegatronModule):  # type: ignore[misc]
        """megatron's core attention over a packed THD row, through `packed_causal_attention`."""

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     softmax_scale: float | None = None, **kwargs: Any) -> None:  # fmt: skip
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                    attn_mask_type: Any = None, attention_bias: Any = None,
                    packed_seq_params: Any = None) -> torch.Tensor:  # fmt: skip
            if packed_seq_params is None:
                raise ValueError("PackedCoreAttention takes packed (THD) rows only")
            # query [T, H, D], key / value [T, H_kv, D]; megatron reshapes the output to [T, 1, H * D]
            return packed_causal_attention(
                query, key, value, packed_seq_params.cu_seqlens_q, packed_seq_params.max_seqlen_q,
                softmax_scale=self.softmax_scale, backend=BACKEND["name"],  # type: ignore[arg-type]
            )  # fmt: skip

    return PackedCoreAttention


@contextlib.contextmanager
def megatron_world(device: torch.device) -> Iterator[None]:
    """torch.distributed (one rank: NCCL on CUDA, gloo on CPU) and megatron-core's parallel state, TP 1."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from entrepot.resharding.engines.megatron_cpu import enable_cpu_mode

    enable_cpu_mode(device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    port = 29_500 + os.getpid() % 2000
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)  # fmt: skip
    try:
        mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        model_parallel_cuda_manual_seed(0)
        yield
    finally:
        mpu.destroy_model_parallel()
        dist.destroy_process_group()


def build_megatron(shape: Shape, device: torch.device) -> tuple[Any, Any]:
    """The DDP-wrapped GPTModel (bf16 on CUDA, fp32 on CPU) and megatron's optimizer.

    Call it inside `megatron_world`.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from entrepot.resharding.engines.megatron_model import transformer_config

    hf_config = shape.hf_config()
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # megatron's CPU mode is fp32 (megatron_cpu)
    config = transformer_config(hf_config, cpu=not cuda, params_dtype=dtype)
    config.use_cpu_initialization = not cuda  # initialise on the GPU: 0.6B random weights in seconds
    spec = get_gpt_layer_local_spec(qk_layernorm=True)
    spec.submodules.self_attention.submodules.core_attention = _packed_core_attention_class()
    model = GPTModel(
        config, spec, vocab_size=shape.vocab, max_sequence_length=hf_config.max_position_embeddings,
        share_embeddings_and_output_weights=True, position_embedding_type="rope",
        rotary_base=int(_rope_theta(hf_config)),
    ).to(device)  # fmt: skip
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                              use_distributed_optimizer=False), model,
    )  # fmt: skip
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.0, clip_grad=1.0, bf16=cuda,
                        params_dtype=dtype, use_distributed_optimizer=False),
        [ddp],
    )  # fmt: skip
    return ddp, optimizer


def _rope_theta(hf_config: Any) -> float:
    """RoPE base: transformers 5 keeps it in rope_parameters, 4 as rope_theta."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10_000.0)))


def packed_seq_params(batch: PackedBatch) -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=batch.cu_seqlens, cu_seqlens_kv=batch.cu_seqlens,
                           max_seqlen_q=batch.max_len, max_seqlen_kv=batch.max_len)  # fmt: skip


def megatron_logp(ddp: Any, batch: PackedBatch) -> torch.Tensor:
    logits = ddp(batch.tokens[None], batch.positions[None], None, packed_seq_params=packed_seq_params(batch))
    rows = logits[0]  # [T, V]
    return scored_logp(lambda a, b: rows.index_select(0, batch.scored[a:b]), batch.labels, LOGP_CHUNK)


def megatron_train_step(ddp: Any, optimizer: Any, batch: PackedBatch) -> None:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    grpo_loss(megatron_logp(ddp, batch), batch).backward()
    finalize_model_grads([ddp], None)
    optimizer.step()


def bench_megatron(shape: Shape, batch: PackedBatch, device: torch.device, *, warmup: int, repeat: int,
                   peak: float | None) -> dict[str, Any]:  # fmt: skip
    with megatron_world(device):
        ddp, optimizer = build_megatron(shape, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = timed(
            lambda: megatron_train_step(ddp, optimizer, batch), device, warmup=warmup, repeat=repeat
        )
        peak_bytes = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
        dtype = str(next(ddp.parameters()).dtype).removeprefix("torch.")
    kernel = packed_attention_kernel(
        torch.empty(1, 1, shape.head_dim, device=device, dtype=getattr(torch, dtype)),
        batch.cu_seqlens,
        backend=BACKEND["name"],  # type: ignore[arg-type]
    )
    return _result("megatron", shape, batch, times, peak,
                   {"attention_kernel": kernel, "peak_device_bytes": peak_bytes, "dtype": dtype})  # fmt: skip


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def attention_check(device: torch.device, *, tiny: bool) -> dict[str, Any]:
    """The packed attention kernel `auto` picks here, checked against the portable SDPA path (fwd + grads)."""
    lengths, head_dim = ([30, 1, 7, 64], 16) if tiny else ([300, 1, 77, 640], 128)
    gen = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16
    q = torch.randn(sum(lengths), 8, head_dim, generator=gen).to(device, dtype)
    k, v = (torch.randn(sum(lengths), 4, head_dim, generator=gen).to(device, dtype) for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
    grad = torch.randn(q.shape, generator=gen).to(device, dtype)
    results = []
    for backend in ("auto", "sdpa"):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = packed_causal_attention(*inputs, cu, max(lengths), backend=backend)  # type: ignore[arg-type]
        out.backward(grad)
        results.append([out.float(), *(t.grad.float() for t in inputs if t.grad is not None)])
    errors = [float((a - b).norm() / b.norm()) for a, b in zip(*results, strict=True)]
    return {"kernel": packed_attention_kernel(q, cu),
            "relative_error_vs_sdpa": dict(zip(["out", "dq", "dk", "dv"], errors, strict=True))}  # fmt: skip
