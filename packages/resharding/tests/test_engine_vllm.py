"""vLLM engine adapter against a real vLLM (CPU build) and a tiny random Qwen2 built here.

Runs in the ``tests-vllm`` nox session (vLLM pins its own torch, so it has a venv
of its own); skipped only where vLLM is not importable. The model directory (HF config,
safetensors, a word-level tokenizer) is built in code: nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from entrepot.resharding import (
    EngineError,
    LocalResharder,
    Offloader,
    ParallelLayout,
    Resharder,
    ShardingManager,
    WeightResharder,
)
from entrepot.resharding.adaptors import get_adaptor
from entrepot.resharding.engines import TorchTrainingEngine

vllm = pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

from entrepot.resharding.engines.vllm import VllmInferenceEngine  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 2, 3, 4], [17, 5, 200], [42]]
NUM_NEW_TOKENS = 8


def _config() -> Any:
    # head_dim 32: vLLM's CPU attention has no kernel for head_dim 16.
    return transformers.Qwen2Config(
        vocab_size=258,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_id=257,
    )


def _hf_model(seed: int) -> Any:
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(_config()).float().eval()


def _write_model_dir(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(256)} | {"<unk>": 256, "<eos>": 257}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>"
    )
    _hf_model(seed=0).save_pretrained(path)  # the engine starts from other weights than the trainer's
    fast.save_pretrained(path)


def _hf_greedy(model: Any, prompt: list[int]) -> list[int]:
    tokens = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(NUM_NEW_TOKENS):
            next_token = model(input_ids=tokens).logits[0, -1].argmax()
            tokens = torch.cat([tokens, next_token.view(1, 1)], dim=1)
    return tokens[0, len(prompt) :].tolist()


def _vllm_greedy(llm: Any) -> list[list[int]]:
    params = vllm.SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    _write_model_dir(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
        engine = vllm.LLM(
            model=str(path),
            dtype="float32",
            max_model_len=64,
            max_num_seqs=4,
            enforce_eager=True,
            seed=0,
            enable_prefix_caching=True,
        )
        yield engine
    del engine
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)


@pytest.fixture(scope="module")
def engine(llm: Any) -> VllmInferenceEngine:
    """One adapter per LLM: it remembers the KV cache storages it released."""
    return VllmInferenceEngine(llm)


def _manager(engine: VllmInferenceEngine, model: Any, *, bucketed: bool = False) -> ShardingManager:
    adaptor = get_adaptor("Qwen2ForCausalLM", model.config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    resharder: WeightResharder = LocalResharder(adaptor, target="infer")
    if bucketed:  # the collective Resharder on one rank: its buffers, verified checksums
        resharder = Resharder(adaptor, ParallelLayout(), ParallelLayout(), bucket_bytes=2**16, verify=True)
    return ShardingManager(
        TorchTrainingEngine(model, adaptor),
        engine,
        resharder,
        Offloader(model, optimizer),
        offload_grads=False,
        offload_optimizer=False,
    )


def test_resharded_weights_give_hf_greedy_generation(llm: Any, engine: VllmInferenceEngine) -> None:
    model = _hf_model(seed=1)
    expected = [_hf_greedy(model, prompt) for prompt in PROMPTS]
    assert _vllm_greedy(llm) != expected  # the engine's own weights are someone else's
    manager = _manager(engine, model)

    record = manager.enter_infer_mode()

    assert _vllm_greedy(llm) == expected
    assert "load_weights" in record.stages
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    manager.exit_infer_mode()


def test_offload_onload_cycle_follows_training(llm: Any, engine: VllmInferenceEngine) -> None:
    model = _hf_model(seed=2)
    manager = _manager(engine, model, bucketed=True)
    engine.onload()
    kv_bytes = engine.kv_cache_bytes()
    assert kv_bytes > 0
    for step in range(2):
        expected = [_hf_greedy(model, prompt) for prompt in PROMPTS]
        with manager.mode("infer"):
            assert engine.kv_cache_bytes() == kv_bytes
            assert _vllm_greedy(llm) == expected, f"step {step}"
        assert engine.kv_cache_bytes() == 0  # vLLM CPU has no sleep mode: the KV cache is released
        # one step moves the weights the next rollout must see
        with manager.mode("train"), torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.5)


def test_unknown_names_are_refused_before_vllm_is_touched(llm: Any, engine: VllmInferenceEngine) -> None:
    engine.onload()
    model = _hf_model(seed=3)
    adaptor = get_adaptor("Qwen2ForCausalLM", model.config)
    weights = adaptor.train_to_infer(adaptor.hf_to_train(dict(model.named_parameters())))
    before = _vllm_greedy(llm)
    with pytest.raises(EngineError, match="not parameters of Qwen2ForCausalLM"):
        engine.load_weights({**weights, "model.layers.9.mlp.extra.weight": torch.zeros(1)})
    missing = {k: v for k, v in weights.items() if "layers.1.mlp" not in k}
    with pytest.raises(EngineError, match="no weight given"):
        engine.load_weights(missing)
    assert _vllm_greedy(llm) == before
