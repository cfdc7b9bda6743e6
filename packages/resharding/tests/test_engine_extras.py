"""Optional engines: import guards name the extra to install; fused-weight splitting logic.

These run in the default suite (no vLLM, no NPU here); the vLLM adapter itself is exercised
against a real vLLM in test_engine_vllm.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from entrepot.resharding import EngineError, MissingExtraError, ReshardError
from entrepot.resharding.engines.npu import AscendVllmInferenceEngine, require_npu
from entrepot.resharding.engines.vllm import VllmInferenceEngine, require_vllm, split_fused_weights

needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
needs_no_npu = pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed"
)

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@needs_no_vllm
def test_missing_vllm_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r'pip install "\./packages/resharding\[vllm\]"'):
        require_vllm()
    with pytest.raises(ImportError, match=r"\./packages/resharding\[vllm\]"):
        VllmInferenceEngine(object())


@needs_no_npu
def test_missing_npu_stack_names_the_extra() -> None:
    with pytest.raises(
        MissingExtraError, match=r"torch-npu and vllm-ascend .*\./packages/resharding\[npu\]"
    ) as info:
        require_npu()
    assert isinstance(info.value, ReshardError) and info.value.extra == "npu"
    with pytest.raises(MissingExtraError, match="npu"):
        AscendVllmInferenceEngine(object())


def test_split_fused_weights_gives_checkpoint_names_as_views() -> None:
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    fused = {
        "model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, v]),
        "model.layers.0.self_attn.qkv_proj.bias": torch.arange(12.0),
        "model.layers.0.mlp.gate_up_proj.weight": torch.cat([gate, up]),
        "model.norm.weight": torch.ones(4),
    }
    sizes = {"model.layers.0.self_attn.qkv_proj": [8, 2, 2], "model.layers.0.mlp.gate_up_proj": [6, 6]}

    split = dict(split_fused_weights(fused, PACKED, sizes))

    assert sorted(split) == sorted(
        [f"model.layers.0.self_attn.{p}_proj.{kind}" for p in "qkv" for kind in ("weight", "bias")]
        + ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    )
    assert torch.equal(split["model.layers.0.self_attn.k_proj.weight"], k)
    assert torch.equal(split["model.layers.0.self_attn.v_proj.bias"], torch.arange(10.0, 12.0))
    assert torch.equal(split["model.layers.0.mlp.up_proj.weight"], up)
    fused_qkv = fused["model.layers.0.self_attn.qkv_proj.weight"]
    assert (
        split["model.layers.0.self_attn.q_proj.weight"].untyped_storage().data_ptr() == fused_qkv.data_ptr()
    )


def test_split_fused_weights_refuses_wrong_row_counts() -> None:
    fused = {"model.layers.0.self_attn.qkv_proj.weight": torch.zeros(11, 4)}
    sizes = {"model.layers.0.self_attn.qkv_proj": [8, 2, 2]}
    with pytest.raises(EngineError, match=r"has 11 rows; .* sizes \[8, 2, 2\]"):
        list(split_fused_weights(fused, PACKED, sizes))
