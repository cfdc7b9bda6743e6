"""A local HF Llama directory + jsonl prompts through the full worker path (in-process dock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests_support_models import tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.trainer import Trainer

pytestmark = pytest.mark.integration  # a training run


def test_llama_directory_trains_through_the_llama_rollout_engine(tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path / "llama", architecture="llama")
    data = tmp_path / "train.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"prompt": f"what is {i % 3 + 1} ?", "answer": str(i % 3 + 1)}) for i in range(12)
        )
    )
    config = load_config(None, [
        f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={data}",
        "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=4", "rollout.max_new_tokens=4",
        "reward.verifiers={exact_match: 1.0, partial_credit: 0.5}", "resources.use_ray=false",
        "max_steps=1", "eval.num_prompts=2", "logging.tensorboard=false",
        "algorithm.entropy_coef=0.01",  # a gradient even if every reward of the random model ties
    ])  # fmt: skip
    said: list[str] = []
    trainer = Trainer(config, tmp_path / "run", on_startup=said.append)
    try:
        before = trainer.parameters()
        metrics = trainer.train_step()
        after = trainer.parameters()
    finally:
        trainer.close()
    # the dtype after the comma is the CPU's (engine.rollout_dtype: auto)
    assert any(line.startswith("rollout engine: llama kv-cache (LlamaForCausalLM), ") for line in said)
    assert metrics["response_length"] > 0 and "accuracy" in metrics
    assert "time/reshard_to_infer" in metrics
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed, "the update changed no parameter"
