"""Multi-turn training runs: the built-in calculator in one process and asynchronously, a local HF model
through HF `generate` with a custom environment, failures that end only their trajectories, and a
chat template that is not append-only refused before the run.

(The example config's learning curve is trained by packages/cli/tests/test_example_configs.py, the
megatron engine's multi-turn run lives in test_megatron.py, vLLM's in test_vllm.py.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests_support_envs import CALCULATOR

from entrepot.grpo import load_config
from entrepot.grpo.errors import EnvironmentFailure, TemplateError
from entrepot.grpo.run.preflight import check_inputs
from entrepot.grpo.trainer import Trainer

pytestmark = pytest.mark.integration  # training runs

SMALL = [
    "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=4", "eval.every=0", "eval.num_prompts=8",
    "checkpoint.save_every=0", "logging.tensorboard=false",
]  # fmt: skip


def _fit(tmp_path: Path, *overrides: str) -> list[dict]:
    trainer = Trainer(load_config(None, [*SMALL, *overrides]), tmp_path / "run")
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_calculator_trains_in_one_process_with_tool_tokens_in_the_trajectories(tmp_path: Path) -> None:
    rows = _fit(tmp_path, *CALCULATOR, "max_steps=3", "logging.samples_every=3", "algorithm.epochs=2")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["multiturn/trajectories"] == 32 and r["multiturn/env_failures"] == 0 for r in rows)
    assert any(r["env/tool_calls"] > 0 and r["multiturn/env_token_frac"] > 0 for r in rows)
    assert "accuracy" in rows[-1] and "eval_turns" in rows[-1]  # the greedy multi-turn evaluation
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["end"] in ("done", "max_turns", "max_tokens") for s in samples)
    tool_turns = [s for s in samples if ">" in s["response"]]  # the tool's message, in the response
    assert all(s["end"] == "done" for s in tool_turns)


def test_calculator_on_two_data_parallel_ranks_through_ray(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each Ray actor rank runs its own trajectories; the reward worker reads the environment's reward."""
    rows = _fit(
        tmp_path, *CALCULATOR, "max_steps=1", "resources.num_actor_workers=2", "resources.use_ray=true"
    )
    assert [r["step"] for r in rows] == [1] and rows[0]["multiturn/env_failures"] == 0
    ends = sum(v for k, v in rows[0].items() if k.startswith("multiturn/end_"))
    assert rows[0]["multiturn/trajectories"] == ends == 32  # both ranks' trajectories, summed
    assert rows[0]["multiturn/env_token_frac"] > 0 and "accuracy" in rows[0]  # evaluated through Ray


def test_multiturn_in_async_mode(tmp_path: Path) -> None:
    rows = _fit(tmp_path, *CALCULATOR, "trainer.mode=async", "max_steps=3")
    assert [r["step"] for r in rows] == [1, 2, 3]
    ages = {k for r in rows for k, v in r.items() if k.startswith("async/tokens_age_") and v}
    assert ages and ages <= {"async/tokens_age_0", "async/tokens_age_1"}
    versions = [r["async/rollout_version"] for r in rows]  # each version loaded or skipped for a newer
    assert sum(r["async/weight_loads"] + r["async/weight_versions_skipped"] for r in rows) == versions[-1] + 1
    assert versions == sorted(versions) and versions[-1] >= 3 - 1 - 1
    assert all("offpolicy/is_weight_mean" in r for r in rows)  # the correction over the model's tokens


def test_a_failing_environment_ends_only_its_trajectories(tmp_path: Path) -> None:
    """Raising, a str in the info and a NaN verdict end only their trajectories, none counts as
    correct, and no early stop follows from them (issue 58: the str crashed the run, NaN was correct)."""
    env = "multiturn.environment=tests_support_envs:MisbehavesOnOddRows"
    rows = _fit(tmp_path, env, "max_steps=2", "logging.samples_every=1", "logging.samples_per_step=32",
                "eval.every=1", "eval.target_accuracy=0.1")  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2]  # no early stop on a success that did not happen
    assert all(r["multiturn/env_failures"] == 16 and r["multiturn/end_env_error"] == 8 for r in rows)
    assert all(r["multiturn/end_env_malformed"] == 8 and r["multiturn/end_done"] == 16 for r in rows)
    assert all(r["reward_mean"] == 0.5 and r["accuracy"] == 0.0 and r["env/correct"] == 0.0 for r in rows)
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["end"] for s in samples} == {"done", "env_error", "env_malformed"}
    with pytest.raises(EnvironmentFailure, match=r"dock row \d+ .*tool backend down"):
        _fit(tmp_path / "fast", env, "max_steps=1", "multiturn.fail_fast=true")


def _local_model(tmp_path: Path, template: str) -> tuple[Path, Path]:
    from tests_support_models import chatml_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = chatml_tokenizer(template)
    model_dir = tmp_path / "llama"
    tok.save_pretrained(model_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(model_dir)
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) for i in range(32)))
    return model_dir, data


def test_a_local_hf_model_runs_multiturn_through_hf_generate(tmp_path: Path) -> None:
    from tests_support_models import CHATML_TEMPLATE

    model_dir, data = _local_model(tmp_path, CHATML_TEMPLATE)
    overrides = [
        f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={data}", "data.max_prompt_tokens=32",
        "rollout.max_new_tokens=4", "rollout.prompts_per_step=2",
        "multiturn.environment=tests_support_envs:Echo",
        "multiturn.max_tokens=64", "multiturn.max_observation_tokens=32", "max_steps=2",
    ]  # fmt: skip
    check_inputs(load_config(None, [*SMALL, *overrides]))  # the template check passes
    rows = _fit(tmp_path, *overrides)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["multiturn/turns_mean"] > 1 and r["multiturn/env_token_frac"] > 0 for r in rows)
    assert sum(r["multiturn/end_done"] for r in rows) > 0


def test_a_template_that_rewrites_earlier_turns_is_refused_before_the_run(tmp_path: Path) -> None:
    rewrites = (  # earlier assistant turns lose their content, as templates that strip reasoning do
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model_dir, data = _local_model(tmp_path, rewrites)
    config = load_config(None, [
        *SMALL, f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={data}",
        "data.max_prompt_tokens=32", "multiturn.environment=tests_support_envs:Echo",
        "multiturn.max_tokens=48",
    ])  # fmt: skip
    with pytest.raises(TemplateError, match=r"model\.path .* turn \d"):
        check_inputs(config)
