"""engine.train=megatron with a local model: what megatron-core's recipe cannot build is refused before
start, naming config.json's key and what is allowed (`check_inputs`, which `rl grpo config validate`
and `train` run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests_support_models import tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.errors import GRPOConfigError
from entrepot.grpo.run.preflight import check_inputs


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("llama"), architecture="llama")


def _edited(source: Path, where: Path, **fields: Any) -> Path:
    """A copy of `source`'s model directory (links to its files) with `fields` set in config.json."""
    where.mkdir()
    for file in source.iterdir():
        (where / file.name).symlink_to(file)
    config = json.loads((source / "config.json").read_text()) | fields
    (where / "config.json").unlink()
    (where / "config.json").write_text(json.dumps(config))
    return where


MEGATRON = ["engine.train=megatron", "rollout.max_new_tokens=8"]


def test_a_llama_with_llama3_rope_scaling_passes(llama_dir: Path, tmp_path: Path) -> None:
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=8192)  # fmt: skip
    scaled = _edited(llama_dir, tmp_path / "llama3", rope_parameters=rope, max_position_embeddings=16384)
    check_inputs(load_config(None, [f"model.path={scaled}", *MEGATRON]))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                   original_max_position_embeddings=32)),
         r"config\.json's rope_parameters\.rope_type \('yarn'\) is not served by megatron-core; allowed: "
         r"default, linear, llama3"),
        (dict(architectures=["MistralForCausalLM"], model_type="mistral"),
         r"config\.json's architecture 'MistralForCausalLM' has no megatron-core GPTModel recipe; known: "
         r"GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"),
        (dict(hidden_act="gelu"), r"config\.json's hidden_act \('gelu'\)"),
    ],
    ids=["rope-yarn", "architecture", "activation"],
)  # fmt: skip
def test_what_megatron_cannot_build_is_refused_before_start(
    llama_dir: Path, tmp_path: Path, fields: dict[str, Any], match: str
) -> None:
    model = _edited(llama_dir, tmp_path / "model", **fields)
    where = r"^model\.path \('.*'\) with engine\.train=megatron: its "
    with pytest.raises(GRPOConfigError, match=where + match):
        check_inputs(load_config(None, [f"model.path={model}", *MEGATRON]))
    check_inputs(load_config(None, [f"model.path={model}", "rollout.max_new_tokens=8"]))  # torch trains it
