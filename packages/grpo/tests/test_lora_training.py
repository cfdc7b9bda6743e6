"""LoRA end to end on the embedded default: a resume is bit-exact, only the adapters move, and each
checkpoint holds the merged HF model (which transformers loads) and peft's adapter. (The reward rising
with LoRA: packages/cli/tests/test_example_configs.py trains configs/lora.yaml.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from entrepot.grpo import load_config, train

pytest.importorskip("peft")

pytestmark = pytest.mark.integration  # training runs

LORA = ["model.lora.rank=8", "model.lora.alpha=16", "model.lora.target_modules=[c_attn,c_proj,c_fc]",
        "model.lora.modules_to_save=[wte,wpe,ln_f]", "algorithm.lr=2e-3"]  # fmt: skip
"""packages/cli/configs/lora.yaml's settings (its test trains the file itself through `rl`)."""
QUICK = ["resources.use_ray=false", "logging.tensorboard=false", "eval.every=0", "eval.num_prompts=16"]


def test_lora_resumes_bit_exactly_and_exports_a_loadable_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = load_config(None, [*LORA, *QUICK, "max_steps=3", "checkpoint.save_every=2"])
    full = tmp_path / "full"
    train(config, full)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000003")
    assert train(config, resumed, resume=True).steps == 3
    last = [
        load_file(str(run / "checkpoints" / "step_000003" / "model.safetensors")) for run in (full, resumed)
    ]
    start = load_file(str(full / "checkpoints" / "step_000002" / "model.safetensors"))
    assert last[0].keys() == last[1].keys() and all(torch.equal(last[0][k], last[1][k]) for k in last[0])
    adapters = [k for k in start if ".lora_B." in k]
    assert adapters and any(not torch.equal(last[0][k], start[k]) for k in adapters)
    frozen = [k for k in start if ".base_layer." in k]
    assert frozen and all(torch.equal(last[0][k], start[k]) for k in frozen)  # the base never moves
    hf = full / "checkpoints" / "step_000003" / "hf"
    assert (hf / "adapter" / "adapter_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert model.config.model_type == "gpt2"
