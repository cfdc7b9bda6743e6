"""Weight adaptors on real, randomly initialised tiny transformers models.

The reference inference layout is written here independently of the adaptors, straight from
the HF tensors, the way vLLM fuses and shards them: ``qkv_proj = [q; k; v]``,
``gate_up_proj = [gate; up]``, ``w13_weight`` / ``w2_weight`` stacks, ``[out, in]`` GPT-2 weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from entrepot.resharding import (
    LayoutError,
    ParallelLayout,
    ShapeMismatchError,
    UnknownArchitectureError,
    UnknownWeightError,
    WeightAdaptor,
    adaptor_for_config,
    get_adaptor,
    known_architectures,
    register_adaptor,
)
from entrepot.resharding.adaptors import LlamaAdaptor
from entrepot.resharding.adaptors.layouts import (
    deinterleave_qkv,
    interleave_qkv,
    interleaved_qkv_to_fused,
    shard_dim,
    unshard_dim,
)
from entrepot.resharding.layout import layers_of_stage

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "LlamaForCausalLM": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "Qwen2ForCausalLM": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "Qwen3ForCausalLM": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "Qwen3MoeForCausalLM": (
        "Qwen3MoeConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            mlp_only_layers=[0],
        ),
    ),
    "DeepseekV3ForCausalLM": (
        "DeepseekV3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            first_k_dense_replace=1,
            q_lora_rank=12,
            kv_lora_rank=8,
            qk_nope_head_dim=4,
            qk_rope_head_dim=2,
            v_head_dim=4,
            n_group=1,
            topk_group=1,
        ),
    ),
    "DeepseekV2ForCausalLM": (
        "DeepseekV2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            first_k_dense_replace=1,
            q_lora_rank=12,
            kv_lora_rank=8,
            qk_nope_head_dim=4,
            qk_rope_head_dim=2,
            v_head_dim=4,
            n_group=1,
            topk_group=1,
        ),
    ),
    "GPT2LMHeadModel": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=16)),
}


def _model(architecture: str, tie: bool = False) -> tuple[Any, torch.nn.Module]:
    config_class, extra = CONFIGS[architecture]
    kwargs = {**COMMON, **extra} if architecture != "GPT2LMHeadModel" else {"vocab_size": 64, **extra}
    if architecture != "GPT2LMHeadModel":
        kwargs["tie_word_embeddings"] = tie
    config = getattr(transformers, config_class)(**kwargs)
    config.architectures = [architecture]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():  # some classes zero-init parameters (biases, correction bias): randomise all
        for param in model.parameters():
            param.normal_(0, 0.2)
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.2)
    return config, model


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _vllm_reference(architecture: str, state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The inference layout written from scratch from HF tensors."""
    out: dict[str, torch.Tensor] = {}
    gpt2 = architecture == "GPT2LMHeadModel"
    for name, tensor in state.items():
        if name == "lm_head.weight" and (tied or gpt2):
            continue
        if gpt2 and name.endswith("attn.c_attn.weight"):
            out[name.replace("c_attn", "qkv_proj")] = tensor.t()
        elif gpt2 and name.endswith("attn.c_attn.bias"):
            out[name.replace("c_attn", "qkv_proj")] = tensor
        elif gpt2 and name.endswith(("c_proj.weight", "c_fc.weight")):
            out[name] = tensor.t()
        elif ".q_proj." in name:
            parts = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat(parts)
        elif ".gate_proj." in name:
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [tensor, state[name.replace("gate", "up")]]
            )
        elif name.endswith("experts.gate_up_proj"):
            out[name.replace("gate_up_proj", "w13_weight")] = tensor
        elif name.endswith("experts.down_proj"):
            out[name.replace("down_proj", "w2_weight")] = tensor
        elif not any(p in name for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = tensor
    return out


def _vllm_tp_shard(name: str, tensor: torch.Tensor, config: Any, tp: int, rank: int) -> torch.Tensor:
    """Cut one inference weight the way vLLM's parallel layers shard it."""
    dims = get_adaptor(config.architectures[0], config).dims

    def cut(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.chunk(tp, dim=dim)[rank]

    if "qkv_proj" in name:
        q_rows, kv_rows = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
        return torch.cat([cut(p, 0) for p in tensor.split([q_rows, kv_rows, kv_rows])])
    if "gate_up_proj" in name:
        return torch.cat([cut(p, 0) for p in tensor.chunk(2)])
    if name.endswith("w13_weight"):
        return torch.cat([cut(p, 1) for p in tensor.chunk(2, dim=1)], dim=1)
    if name.endswith("w2_weight"):
        return cut(tensor, 2)
    if name.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight")):
        return cut(tensor, 1)
    if name.endswith(
        (
            "embed_tokens.weight",
            "lm_head.weight",
            "wte.weight",
            "q_b_proj.weight",
            "kv_b_proj.weight",
            "c_fc.weight",
            "c_fc.bias",
        )
    ):
        return cut(tensor, 0)
    return tensor


ARCHITECTURES = list(CONFIGS)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_hf_to_train_to_infer_equals_the_reference(architecture: str) -> None:
    config, model = _model(architecture)
    state = _state(model)
    adaptor = adaptor_for_config(config)
    got = adaptor.train_to_infer(adaptor.hf_to_train(state))
    expected = _vllm_reference(architecture, state, tied=False)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert sorted(adaptor.hf_to_infer(state)) == sorted(expected)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_train_shards_convert_to_vllm_tensor_parallel_shards(architecture: str) -> None:
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    full_train = adaptor.hf_to_train(_state(model))
    reference = _vllm_reference(architecture, _state(model), tied=False)
    for rank in range(2):
        got = adaptor.train_to_infer(adaptor.shard(full_train, ParallelLayout(tp=2), tp_rank=rank))
        assert sorted(got) == sorted(reference)
        for name, tensor in reference.items():
            assert torch.equal(got[name], _vllm_tp_shard(name, tensor, config, 2, rank)), (rank, name)


@pytest.mark.parametrize("architecture", ["Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"])
def test_expert_parallel_shards_stack_the_owned_experts(architecture: str) -> None:
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    full_train = adaptor.hf_to_train(_state(model))
    reference = _vllm_reference(architecture, _state(model), tied=False)
    layout = ParallelLayout(tp=2, ep=2, expert_tp=1)
    for ep_rank in range(2):
        got = adaptor.train_to_infer(
            adaptor.shard(full_train, layout, tp_rank=0, ep_rank=ep_rank, etp_rank=0)
        )
        w13 = got["model.layers.1.mlp.experts.w13_weight"]
        assert torch.equal(
            w13, reference["model.layers.1.mlp.experts.w13_weight"][2 * ep_rank : 2 * ep_rank + 2]
        )
        assert got["model.layers.1.mlp.experts.w2_weight"].shape[0] == 2


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_infer_to_train_of_the_reference_gives_the_training_layout(architecture: str) -> None:
    """The inverse checked against the reference built from HF tensors, not against the forward."""
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    expected = adaptor.hf_to_train(_state(model))
    got = adaptor.infer_to_train(_vllm_reference(architecture, _state(model), tied=False))
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


LAYOUTS = [
    ParallelLayout(),
    ParallelLayout(tp=2),
    ParallelLayout(tp=2, ep=2, expert_tp=1),
    ParallelLayout(tp=1, ep=4),
]
MOE = ("Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")


@pytest.mark.parametrize(
    ("architecture", "layout"),
    [(a, layout) for a in ARCHITECTURES for layout in LAYOUTS if layout.ep == 1 or a in MOE],
    ids=str,
)
def test_infer_to_train_inverts_train_to_infer_on_every_shard(
    architecture: str, layout: ParallelLayout
) -> None:
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    full_train = adaptor.hf_to_train(_state(model))
    world = layout.tp * layout.ep
    for rank in range(world):
        c = layout.coords(rank, world)
        shard = adaptor.shard(full_train, layout, c.tp_rank, 0, c.ep_rank, c.etp_rank)
        experts = [adaptor.param_spec(n).expert for n in shard if adaptor.param_spec(n).is_expert]
        back = adaptor.infer_to_train(adaptor.train_to_infer(shard), first_expert=min(experts, default=0))
        assert sorted(back) == sorted(shard), rank
        for name, tensor in shard.items():
            assert torch.equal(back[name], tensor), (rank, name)


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3ForCausalLM", "GPT2LMHeadModel"])
def test_train_to_hf_loads_back_into_the_model_with_identical_logits(architecture: str) -> None:
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    back = adaptor.train_to_hf(adaptor.hf_to_train(_state(model)))
    _, fresh = _model(architecture)
    with torch.no_grad():
        for param in fresh.parameters():
            param.zero_()
    result = fresh.load_state_dict(back, strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}  # GPT-2 ties it to wte
    tokens = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, fresh(tokens).logits)


@pytest.mark.parametrize("architecture", ["Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"])
def test_moe_checkpoint_from_train_to_hf_loads_with_from_pretrained(
    architecture: str, tmp_path: Path
) -> None:
    """Per-expert checkpoint names, read back by transformers' own conversion to fused experts."""
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    back = adaptor.train_to_hf(adaptor.hf_to_train(_state(model)))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in back
    config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in back.items()}, tmp_path / "model.safetensors")
    loaded = getattr(transformers, architecture).from_pretrained(tmp_path).eval()
    tokens = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, loaded(tokens).logits, rtol=0, atol=0)


def test_tied_embeddings_have_no_head_in_train_and_infer_layouts() -> None:
    config, model = _model("Qwen2ForCausalLM", tie=True)
    adaptor = get_adaptor("Qwen2ForCausalLM", config)
    train = adaptor.hf_to_train(_state(model))
    assert "output_layer.weight" not in train
    assert "lm_head.weight" not in adaptor.train_to_infer(train)


def test_megatron_qkv_is_interleaved_per_query_group() -> None:
    config, model = _model("Qwen2ForCausalLM")
    state = _state(model)
    qkv = get_adaptor("Qwen2ForCausalLM", config).hf_to_train(state)[
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    d, p = 8, 2  # head dim, query heads per group (4 heads / 2 groups)
    for g in range(2):
        block = qkv[g * (p + 2) * d : (g + 1) * (p + 2) * d]
        assert torch.equal(
            block, torch.cat([q[g * p * d : (g + 1) * p * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]])
        )


@settings(max_examples=30, deadline=None)
@given(
    groups=st.integers(1, 4), per_group=st.integers(1, 3), head_dim=st.integers(1, 4), cols=st.integers(0, 3)
)
def test_qkv_layout_functions_are_inverse(groups: int, per_group: int, head_dim: int, cols: int) -> None:
    tail = (cols,) if cols else ()
    q = torch.randn(groups * per_group * head_dim, *tail)
    k, v = torch.randn(groups * head_dim, *tail), torch.randn(groups * head_dim, *tail)
    fused = interleave_qkv(q, k, v, head_dim)
    for got, want in zip(deinterleave_qkv(fused, per_group, head_dim), (q, k, v), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(interleaved_qkv_to_fused(fused, per_group, head_dim), torch.cat([q, k, v]))


def test_shard_dim_cuts_each_fused_chunk() -> None:
    fused = torch.arange(8).reshape(8, 1)  # [gate 0..3; up 4..7]
    assert shard_dim(fused, 0, 2, 1, fused_chunks=2).flatten().tolist() == [2, 3, 6, 7]
    with pytest.raises(ShapeMismatchError, match="divisible"):
        shard_dim(fused, 0, 3, 0)
    shards = [shard_dim(fused, 0, 2, i, fused_chunks=2) for i in range(2)]
    assert torch.equal(unshard_dim(shards, 0, fused_chunks=2), fused)
    with pytest.raises(ShapeMismatchError, match="different shapes"):
        unshard_dim([fused, fused[:4]], 0)


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_unshard_inverts_shard(architecture: str, tp: int, pp: int) -> None:
    config, model = _model(architecture)
    adaptor = get_adaptor(architecture, config)
    full = adaptor.hf_to_train(_state(model))
    layout = ParallelLayout(tp=tp, pp=pp)
    shards = {(t, p): adaptor.shard(full, layout, tp_rank=t, pp_rank=p) for t in range(tp) for p in range(pp)}
    got = adaptor.unshard(shards, layout)
    assert sorted(got) == sorted(full)
    for name, tensor in full.items():
        assert got[name].shape == tensor.shape and torch.equal(got[name], tensor), name


@pytest.mark.parametrize(
    "layout", [ParallelLayout(tp=2, pp=2), ParallelLayout(tp=2, ep=2, expert_tp=1)], ids=["tp2pp2", "tp2ep2"]
)
def test_unshard_from_one_shard_per_rank_with_data_parallel_and_experts(layout: ParallelLayout) -> None:
    config, model = _model("Qwen3MoeForCausalLM")
    adaptor = get_adaptor("Qwen3MoeForCausalLM", config)
    full = adaptor.hf_to_train(_state(model))
    ranks = [layout.coords(rank, 4) for rank in range(4)]
    shards = [adaptor.shard(full, layout, c.tp_rank, c.pp_rank, c.ep_rank, c.etp_rank) for c in ranks]
    got = adaptor.unshard(shards, layout)
    assert sorted(got) == sorted(full)
    assert all(torch.equal(got[name], tensor) for name, tensor in full.items())


def test_unshard_names_the_missing_rank_or_weight() -> None:
    config, model = _model("LlamaForCausalLM")
    adaptor = get_adaptor("LlamaForCausalLM", config)
    full = adaptor.hf_to_train(_state(model))
    layout = ParallelLayout(tp=2, pp=2)
    shards = {(t, p): adaptor.shard(full, layout, tp_rank=t, pp_rank=p) for t in range(2) for p in range(2)}
    with pytest.raises(LayoutError, match=r"no shard for \(tp_rank=1, pp_rank=0\)"):
        adaptor.unshard({k: v for k, v in shards.items() if k != (1, 0)}, layout)
    with pytest.raises(LayoutError, match=r"\[\(2, 0\)\] are outside"):
        adaptor.unshard({**shards, (2, 0): {}}, layout)
    name = "decoder.layers.1.mlp.linear_fc1.weight"
    shards[1, 1] = {n: t for n, t in shards[1, 1].items() if n != name}
    with pytest.raises(LayoutError, match=rf"'{name}' is missing from the shard of \(tp_rank=1, pp_rank=1\)"):
        adaptor.unshard(shards, layout)
    with pytest.raises(LayoutError, match="expert parallelism"):
        adaptor.unshard(shards, ParallelLayout(tp=2, ep=2))
    with pytest.raises(LayoutError, match="divisible"):
        adaptor.unshard(list(shards.values())[:3], layout)


def test_param_specs_and_pipeline_stages() -> None:
    config, _ = _model("Qwen3MoeForCausalLM")
    adaptor = get_adaptor("Qwen3MoeForCausalLM", config)
    fc1 = adaptor.param_spec("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight")
    assert (fc1.tp_dim, fc1.fused_chunks, fc1.expert, fc1.is_expert) == (0, 2, 3, True)
    assert adaptor.param_spec("decoder.layers.0.self_attention.linear_proj.weight").tp_dim == 1
    assert adaptor.param_spec("decoder.layers.0.input_layernorm.weight").tp_dim is None
    layout = ParallelLayout(pp=2)
    assert adaptor.stage_of("embedding.word_embeddings.weight", layout) == 0
    assert adaptor.stage_of("output_layer.weight", layout) == 1
    assert adaptor.stage_of("decoder.layers.1.input_layernorm.weight", layout) == 1
    assert layers_of_stage(8, ParallelLayout(pp=2, vpp=2), 1) == [2, 3, 6, 7]
    with pytest.raises(UnknownWeightError, match="nonsense"):
        adaptor.param_spec("nonsense.weight")


def test_registry_lists_known_architectures_on_a_miss_and_refuses_duplicates() -> None:
    assert set(CONFIGS) <= set(known_architectures())
    with pytest.raises(
        UnknownArchitectureError, match=r"'MambaForCausalLM'.*GPT2LMHeadModel.*Qwen3MoeForCausalLM"
    ):
        get_adaptor("MambaForCausalLM", object())
    with pytest.raises(ValueError, match="already"):
        register_adaptor(LlamaAdaptor)

    class Tiny(WeightAdaptor):
        architectures = ()

    with pytest.raises(ValueError, match="names no architectures"):
        register_adaptor(Tiny)


def test_unmapped_and_incomplete_names_raise_naming_the_key() -> None:
    config, model = _model("LlamaForCausalLM")
    adaptor = get_adaptor("LlamaForCausalLM", config)
    state = _state(model)
    with pytest.raises(UnknownWeightError, match=r"'model\.extra\.weight'"):
        adaptor.hf_to_train({**state, "model.extra.weight": torch.zeros(1)})
    state.pop("model.layers.0.self_attn.k_proj.weight")
    with pytest.raises(UnknownWeightError, match="k_proj"):
        adaptor.hf_to_train(state)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [(dict(tp=0), "tp"), (dict(pp=1, vpp=2), "vpp"), (dict(ep=True), "ep"), (dict(expert_tp=0), "expert_tp")],
)
def test_parallel_layout_validates(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        ParallelLayout(**kwargs)


def test_layout_coordinates_follow_megatron_order() -> None:
    layout = ParallelLayout(tp=2, pp=2, ep=2, expert_tp=1)
    coords = [layout.coords(r, 8) for r in range(8)]
    assert [c.tp_rank for c in coords] == [0, 1] * 4
    assert [c.pp_rank for c in coords] == [0] * 4 + [1] * 4
    assert [c.ep_rank for c in coords] == [0, 1] * 4
    with pytest.raises(LayoutError, match="divisible"):
        layout.coords(0, 6)
