"""A megatron-core ``GPTModel`` built from an HF config, in the training layout the weight adaptors cut.

One builder for every dense architecture with an adaptor: GPT-2 (learned positions, LayerNorm,
tanh-GELU, biases, tied embeddings), Llama (RoPE with its linear / llama3 scaling, RMSNorm, SwiGLU,
GQA, tied or untied head), Qwen2 (QKV bias) and Qwen3 (per-head q/k RMSNorm). What a config asks for
beyond that is refused by ``megatron_support.check_megatron_support`` before a module is built. The model
uses megatron-core's local layer spec (no Transformer Engine needed), so the same module runs on
CPU (see ``megatron_cpu``) and on GPU; weights are loaded afterwards by name
(``WeightAdaptor.shard`` -> ``copy_weights_in_place``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from entrepot.resharding.adaptors.gpt2 import gpt2_activation
from entrepot.resharding.engines.megatron import require_megatron
from entrepot.resharding.engines.megatron_support import (
    MEGATRON_ARCHITECTURES,
    check_megatron_support,
    rope_arguments,
)

__all__ = ["MEGATRON_ARCHITECTURES", "gpt_model_chunks", "transformer_config"]


def transformer_config(hf_config: Any, *, cpu: bool, params_dtype: torch.dtype = torch.float32,
                       **parallel: Any) -> Any:  # fmt: skip
    """megatron-core's ``TransformerConfig`` for `hf_config`.

    Args:
        hf_config: an HF ``PretrainedConfig`` of a supported architecture.
        cpu: build for the CPU mode (``megatron_cpu``): pipeline sends are posted one by one,
            since gloo has no batched p2p. Either way parameters are initialised on the CPU
            (move the chunks with ``.to(device)``) and no fused kernel is asked for, so the
            local spec needs neither apex nor Transformer Engine.
        params_dtype: parameter dtype (fp32 on CPU; bf16 with an fp32 master copy on GPU).
        parallel: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
            ``virtual_pipeline_model_parallel_size`` and other ``ModelParallelConfig`` fields.
    """
    require_megatron()
    from megatron.core.transformer.transformer_config import TransformerConfig

    arch = check_megatron_support(hf_config)
    gpt2 = arch == "GPT2LMHeadModel"
    heads = hf_config.n_head if gpt2 else hf_config.num_attention_heads
    hidden = hf_config.n_embd if gpt2 else hf_config.hidden_size
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    common = dict(
        num_layers=hf_config.n_layer if gpt2 else hf_config.num_hidden_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        kv_channels=head_dim,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        use_cpu_initialization=True,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        variable_seq_lengths=True,  # micro-batches are packed to a token budget, not a fixed shape
        moe_token_dispatcher_type="alltoall",  # the default (allgather) refuses variable lengths
        batch_p2p_comm=not cpu,  # gloo has no batched isend/irecv
        calculate_per_token_loss=True,  # our loss is already normalised over the global batch
    )
    if gpt2:
        arch_fields = dict(
            ffn_hidden_size=hf_config.n_inner or 4 * hidden,
            num_query_groups=heads,
            normalization="LayerNorm",
            layernorm_epsilon=hf_config.layer_norm_epsilon,
            activation_func=gpt2_activation(hf_config.activation_function),
            add_bias_linear=True,
            add_qkv_bias=True,
        )
    else:
        arch_fields = dict(
            ffn_hidden_size=hf_config.intermediate_size,
            num_query_groups=hf_config.num_key_value_heads,
            normalization="RMSNorm",
            layernorm_epsilon=hf_config.rms_norm_eps,
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            add_qkv_bias=arch == "Qwen2ForCausalLM",
            qk_layernorm=arch == "Qwen3ForCausalLM",
        )
    return TransformerConfig(**common, **arch_fields, **parallel)


def gpt_model_chunks(hf_config: Any, config: Any) -> list[torch.nn.Module]:
    """This rank's ``GPTModel`` chunks (one per virtual pipeline stage) for `hf_config`.

    ``megatron.core.parallel_state`` must be initialised with the layout `config` names.
    """
    require_megatron()
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    arch = check_megatron_support(hf_config)
    gpt2 = arch == "GPT2LMHeadModel"
    spec = get_gpt_layer_local_spec(qk_layernorm=arch == "Qwen3ForCausalLM")
    position = {"position_embedding_type": "learned_absolute"} if gpt2 else {
        "position_embedding_type": "rope", **rope_arguments(hf_config)}  # fmt: skip
    vpp = config.virtual_pipeline_model_parallel_size or 1
    chunks: list[torch.nn.Module] = []
    for stage in range(vpp):
        vp_stage = stage if vpp > 1 else None
        chunks.append(
            GPTModel(
                config,
                spec,
                vocab_size=hf_config.vocab_size,
                max_sequence_length=hf_config.n_positions if gpt2 else hf_config.max_position_embeddings,
                pre_process=mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", gpt2)),
                vp_stage=vp_stage,
                **position,
            )
        )
    return chunks
