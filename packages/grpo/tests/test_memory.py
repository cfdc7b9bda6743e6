"""`estimate_memory`: exact parameter counts, the offload keys at the phase switch, TP shards per rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests_support_models import tiny_model_dir

from entrepot.grpo.config import load_config
from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.errors import DataError
from entrepot.grpo.run.memory import estimate_memory, vllm_kv_cache_bytes

TINY_QWEN2 = ["model.architecture=qwen2", "model.hidden_size=32", "model.num_heads=4", "model.num_kv_heads=2",
              "model.intermediate_size=48", "model.num_layers=3"]  # fmt: skip
OFFLOAD = ["engine.offload_params=true", "engine.offload_grads=true", "engine.offload_optimizer=true"]


def _built_numel(overrides: list[str]) -> int:
    config = load_config(None, overrides)
    tok = CharTokenizer()
    model = build_model(
        config.model, tok.vocab_size, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("overrides", [[], TINY_QWEN2], ids=["default-gpt2", "tiny-qwen2"])
def test_param_count_equals_the_built_model(overrides: list[str]) -> None:
    estimate = estimate_memory(load_config(None, overrides))
    assert estimate.num_params == _built_numel(overrides)
    assert estimate.params == 4 * estimate.num_params  # float32, the whole model on the one torch rank
    assert estimate.grads == estimate.params
    assert estimate.optimizer == 2 * estimate.params  # AdamW's two moments
    assert estimate.reference == estimate.params  # kl_coef 0.04: a reference copy


def test_param_count_of_a_local_model_directory(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    directory = tiny_model_dir(tmp_path / "m", "llama")
    loaded = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    config = load_config(None, [f"model.path={directory}", "data.task=reverse"])
    assert estimate_memory(config).num_params == sum(p.numel() for p in loaded.parameters())


def test_a_missing_model_directory_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="must be a local HF model directory"):
        estimate_memory(load_config(None, [f"model.path={tmp_path}"]))


def test_no_reference_without_a_kl_term() -> None:
    assert estimate_memory(load_config(None, ["algorithm.kl_coef=0"])).reference == 0


def test_co_located_reward_models_and_reference_count_unless_on_their_own_workers(tmp_path: Path) -> None:
    from tests_support_models import tiny_reward_model_dir

    from entrepot.grpo.engines.reward_model import load_reward_model

    rm = tiny_reward_model_dir(tmp_path / "rm", "classifier", "qwen2")
    loaded = sum(p.numel() * p.element_size() for p in load_reward_model(rm).parameters())
    co_located = estimate_memory(load_config(None, [f"reward.models={{{rm}: 1.0}}"]))
    assert co_located.reward_models == loaded and co_located.reference == co_located.params
    on_gpu = estimate_memory(load_config(None, [f"reward.models={{{rm}: 1.0}}", "engine.device=cuda"]))
    host = on_gpu.stages[on_gpu.peak_stage][1]  # on an accelerator both wait in host memory by default
    assert host >= on_gpu.reward_models + on_gpu.reference
    rm_models = f"reward.models={{{rm}: 1.0}}"
    separate = estimate_memory(load_config(None, [rm_models, "resources.colocate=false"]))
    assert separate.reward_models == 0 and separate.reference == 0


def test_offload_keys_lower_the_device_peak_at_the_switch() -> None:
    # the estimate needs no GPU (preflight is what checks the machine); the reference stays resident
    on_gpu = ["engine.device=cuda", "engine.offload_reference=false"]
    resident = estimate_memory(load_config(None, on_gpu))
    offloaded = estimate_memory(load_config(None, [*on_gpu, *OFFLOAD]))
    (resident_device, resident_host), (device, host) = (
        resident.stages["generate"],
        offloaded.stages["generate"],
    )
    # params and optimizer state wait in host memory while generating; the gradients are dropped
    assert host == offloaded.params + offloaded.optimizer
    assert resident_host == 0
    assert resident_device - device == resident.params + resident.grads + resident.optimizer
    # the update needs them all back: offloading does not lower it
    assert offloaded.stages["update"] == resident.stages["update"]


def test_on_cpu_offloading_moves_bytes_and_only_dropped_grads_free_any() -> None:
    resident = estimate_memory(load_config(None, []))
    moved = estimate_memory(
        load_config(None, ["engine.offload_params=true", "engine.offload_optimizer=true"])
    )
    dropped = estimate_memory(load_config(None, ["engine.offload_grads=true"]))
    assert moved.host_need_bytes == resident.host_need_bytes
    generate = {name: sum(e.stages["generate"]) for name, e in (("resident", resident), ("dropped", dropped))}
    assert generate["resident"] - generate["dropped"] == resident.grads


def test_tp2_halves_the_sharded_figures_per_rank() -> None:
    megatron = ["engine.train=megatron"]  # with a reference (algorithm.kl_coef 0.04)
    tp1 = estimate_memory(load_config(None, megatron))
    tp2 = estimate_memory(load_config(None, [*megatron, "parallel.train.tensor=2"]))
    assert tp2.num_ranks == 2 and tp2.num_params == tp1.num_params
    for item in ("params", "grads", "optimizer", "reference"):
        ratio = getattr(tp2, item) / getattr(tp1, item)
        assert 0.5 <= ratio < 0.52, (item, ratio)  # layer norms and some biases stay whole on each rank
    # every rank still holds the whole model for the rollout engine, and its own KV cache
    assert tp2.rollout_weights == tp1.rollout_weights == tp1.params
    assert tp2.resharded_copy == tp1.resharded_copy == tp1.params


def test_megatron_pipeline_stages_keep_the_larger_stage_and_the_tied_head() -> None:
    # measured with megatron-core at PP2 on the default: stage 0 holds 52,928 values, stage 1
    # 50,112 plus its own 14 x 64 copy of the tied output layer
    estimate = estimate_memory(load_config(None, ["engine.train=megatron", "parallel.train.pipeline=2"]))
    assert estimate.params == 4 * 52_928


def test_vllm_kv_cache_is_what_the_engine_is_launched_with() -> None:
    config = load_config(None, ["engine.rollout=vllm"])
    estimate = estimate_memory(config)
    # 2 layers x K and V x 2 heads x 32 dims x 4 bytes per token; 256 sequences of one 128-token block
    assert estimate.kv_cache == 2 * 2 * 2 * 32 * 4 * 256 * 128
    assert "kv_cache_memory_bytes" in estimate.kv_cache_basis


def test_torch_kv_cache_is_batch_times_tokens_times_layers_heads() -> None:
    estimate = estimate_memory(load_config(None, []))
    # a rank's 32 x 8 rollout rows (256, as many as evaluation's prompts), 9 prompt + 8 response tokens
    assert estimate.kv_cache == 256 * 17 * 2 * 2 * 2 * 32 * 4
    assert "256 sequences x 17 tokens" in estimate.kv_cache_basis


def test_vllm_kv_cache_bytes_rounds_up_to_whole_blocks() -> None:
    class Config:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 2, 4, 2, 64

    assert vllm_kv_cache_bytes(Config(), 129, 3) == 2 * 2 * 2 * 16 * 4 * 3 * 256


def test_the_update_counts_activations_and_logits_and_checkpointing_lowers_them(tmp_path: Path) -> None:
    import json

    directory = tiny_model_dir(tmp_path / "m", "llama")
    config_file = directory / "config.json"  # 4 layers: only the config is read
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "num_hidden_layers": 4}))
    llama = [f"model.path={directory}", "data.task=reverse"]
    plain = estimate_memory(load_config(None, llama))
    checkpointed = estimate_memory(load_config(None, [*llama, "engine.activation_checkpointing=true"]))
    assert plain.activations > checkpointed.activations > 0 and plain.logits == checkpointed.logits > 0
    update_device, _ = plain.stages["update"]
    # the Llama-family engine reads the policy's parameters: no rollout copy (`can_read_policy`)
    assert plain.rollout_weights == 0 and plain.resharded_copy == 0
    state = plain.params + plain.grads + plain.lane_grads + plain.optimizer + plain.reference
    assert update_device == state + plain.activations + plain.logits + plain.runtime
    assert "prompts shared" in plain.activations_basis and "checkpointed" in checkpointed.activations_basis


def test_a_bfloat16_reference_counts_half() -> None:
    full = estimate_memory(load_config(None, []))
    half = estimate_memory(load_config(None, ["model.reference_dtype=bfloat16"]))
    assert half.reference * 2 == full.reference == full.params


def test_each_extra_update_lane_holds_a_gradient_set_until_they_are_summed() -> None:
    one, two = (estimate_memory(load_config(None, [*TINY_QWEN2, f"threads.lanes={n}"])) for n in (1, 2))
    assert one.lane_grads == 0 and two.lane_grads == two.params == two.grads
    assert sum(two.stages["update"]) - sum(one.stages["update"]) == two.params
    assert two.stages["generate"] == one.stages["generate"]  # summed before the step ends
    on_ray = estimate_memory(load_config(None, [*TINY_QWEN2, "resources.use_ray=true"]))
    assert on_ray.lane_grads == 0  # Ray workers share the cores: one lane
