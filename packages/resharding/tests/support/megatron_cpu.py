"""Test support: run megatron-core on CPU (gloo) by shimming the few CUDA calls it makes.

TEST CODE ONLY, never imported by the library. megatron-core assumes a GPU in a handful of
places: ``torch.cuda.current_device()`` as a device, ``torch.cuda.synchronize``, the CUDA RNG
state used by its RNG tracker, and tensor factories called with ``device="cuda"``. On CPU
those are pointed at the CPU equivalents, in a spawned worker process only (the patches are
process-wide), before megatron is imported.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

_FACTORIES = (
    "empty", "zeros", "ones", "full", "arange", "tensor", "randn", "rand", "randint",
    "empty_like", "zeros_like", "ones_like",
)  # fmt: skip


def _on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return wrapper


def install_cuda_shim() -> None:
    """Point megatron-core's CUDA calls at the CPU (idempotent; call before importing megatron)."""
    if getattr(torch.cuda, "_entrepot_cpu_shim", False):
        return
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    # the CPU generator stands in for the GPU's (torch.manual_seed itself calls manual_seed_all)
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(seed)  # type: ignore[assignment]
    torch.cuda.manual_seed_all = lambda seed: None  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda device=None: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda state, device=None: torch.set_rng_state(state)  # type: ignore[assignment]
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[assignment,method-assign]
    for name in _FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    import megatron.core.tensor_parallel.random as megatron_random

    megatron_random._get_cuda_rng_state = (  # type: ignore[assignment]
        lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    )
    megatron_random._set_cuda_rng_state = (  # type: ignore[assignment]
        lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    )
    torch.cuda._entrepot_cpu_shim = True  # type: ignore[attr-defined]


def init_parallel(rank: int, world_size: int, port: int, tp: int = 1, pp: int = 1, seed: int = 0) -> None:
    """gloo process group + megatron-core parallel state (+ its RNG tracker)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    install_cuda_shim()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)


def qwen2_gpt_model(hf_config: Any) -> torch.nn.Module:
    """This rank's megatron-core GPTModel (local spec, fp32, CPU) for a Qwen2 config."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        pipeline_dtype=torch.float32,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=hf_config.hidden_size // hf_config.num_attention_heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )
    return GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=int(hf_config.rope_theta) if hasattr(hf_config, "rope_theta") else 10000,
    )


# --------------------------------------------------------------------------- spawned workers
QWEN2_CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def _hf_qwen2() -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(**QWEN2_CONFIG)
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():  # HF initialises biases to zero; make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.02)
    return model


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, QWEN2_CONFIG["vocab_size"], (2, 12), generator=generator)
    return tokens, torch.arange(12).expand(2, 12)


def check_layouts(rank: int, port: int) -> None:
    """On 2 gloo ranks, for DP=2 (TP=1), TP=2 and PP=2: this rank's GPTModel shard has the
    global training names and shapes the adaptor cuts; loading HF weights by those names gives
    HF's logits (or this rank's vocab columns of them); resharding to TP=1 gives the inference
    layout of the HF model; an offload/onload cycle of params, grads and optimizer state
    restores every value."""
    import torch.distributed as dist

    init_parallel(rank, 2, port)
    from entrepot.resharding import Offloader, ParallelLayout, Resharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.megatron import MegatronTrainingEngine
    from entrepot.resharding.engines.torch import copy_weights_in_place

    hf = _hf_qwen2()
    hf_state = {name: p.detach() for name, p in hf.named_parameters()}
    adaptor = get_adaptor("Qwen2ForCausalLM", hf.config)
    train_full = adaptor.hf_to_train(hf_state)
    reference = adaptor.hf_to_infer(hf_state)
    for tp, pp in ((1, 1), (2, 1), (1, 2)):
        init_parallel(rank, 2, port, tp=tp, pp=pp)
        layout = ParallelLayout(tp=tp, pp=pp)
        coords = layout.coords(rank, world_size=2)
        tp_rank, pp_rank = coords.tp_rank, coords.pp_rank
        model = qwen2_gpt_model(hf.config)
        engine = MegatronTrainingEngine(model)
        assert engine.layout == layout, engine.layout
        shard = adaptor.shard(train_full, layout, tp_rank=tp_rank, pp_rank=pp_rank)
        meta = engine.train_meta()
        assert meta == {n: (tuple(t.shape), t.dtype) for n, t in shard.items()}, (
            layout,
            sorted(set(meta) ^ set(shard)),
        )
        copy_weights_in_place(engine.named_train_parameters(), shard)
        if pp == 1:  # vocab-parallel logits of this rank equal HF's columns
            tokens, positions = _tokens()
            with torch.no_grad():
                logits = model(tokens, positions, attention_mask=None)
                columns = hf(input_ids=tokens).logits.chunk(tp, dim=-1)[tp_rank]
            torch.testing.assert_close(logits, columns, rtol=1e-4, atol=1e-4)
        infer = Resharder(adaptor, layout, ParallelLayout(tp=1)).reshard(engine.named_train_parameters())
        assert sorted(infer) == sorted(reference), layout
        assert all(torch.equal(infer[n], reference[n]) for n in reference), layout
        if pp == 1:  # a training step (the model's weights change) and an offload cycle
            _check_offload_cycle(model, engine, *_tokens(), Offloader)
        dist.barrier()


def _check_offload_cycle(model: Any, engine: Any, tokens: Any, positions: Any, offloader_cls: Any) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(tokens, positions, attention_mask=None).logsumexp(-1).mean().backward()
    optimizer.step()
    before = {n: t.clone() for n, t in engine.named_train_parameters().items()}
    offloader = offloader_cls(model, optimizer)
    offloader.offload_optimizer()
    offloader.offload_grads(keep=False)
    offloader.offload_params()
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    offloader.onload_params()
    offloader.onload_optimizer()
    offloader.onload_grads()
    after = engine.named_train_parameters()
    assert all(torch.equal(before[n], after[n]) for n in before)
