"""megatron-core adapter against a real GPTModel on CPU (gloo; CUDA calls shimmed in test support)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from entrepot.resharding import EngineError
from entrepot.resharding.engines.megatron import global_train_name

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent / "support"))  # spawned children import it by name
import megatron_cpu


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_gpt_model_shards_in_training_layout_on_dp2_tp2_pp2() -> None:
    """Real GPTModel on 2 gloo ranks; the checks (see ``check_layouts``) run in the workers."""
    mp.spawn(megatron_cpu.check_layouts, args=(_free_port(),), nprocs=2, join=True)


def test_global_names_from_local_layers_experts_and_te_modules() -> None:
    layers, experts = [4, 5], [6, 7]
    assert global_train_name("decoder.layers.1.mlp.linear_fc2.weight", layers, []) == (
        "decoder.layers.5.mlp.linear_fc2.weight"
    )
    assert global_train_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", layers, []) == (
        "decoder.layers.4.input_layernorm.weight"
    )
    assert global_train_name("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", layers, []) == (
        "decoder.layers.5.pre_mlp_layernorm.weight"
    )
    assert global_train_name(
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight", layers, experts
    ) == ("decoder.layers.4.mlp.experts.local_experts.7.linear_fc1.weight")
    assert global_train_name("decoder.layers.1.mlp.experts.linear_fc2.weight0", layers, experts) == (
        "decoder.layers.5.mlp.experts.local_experts.6.linear_fc2.weight"
    )
    assert (
        global_train_name("embedding.word_embeddings.weight", layers, experts)
        == "embedding.word_embeddings.weight"
    )
    with pytest.raises(EngineError, match="local layer 2 but the chunk has 2 layers"):
        global_train_name("decoder.layers.2.input_layernorm.weight", layers, [])
    with pytest.raises(EngineError, match="local expert 3 but this rank has 2 experts"):
        global_train_name("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight", layers, experts)
