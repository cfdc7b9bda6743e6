"""What `check_machine` and `check_inputs` refuse before a worker starts: each names the key or file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tests_support_models import tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.errors import DataError, GRPOConfigError, RewardError
from entrepot.grpo.run.preflight import check_inputs, check_machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))  # 32 positions, 2 heads, 1 layer


def _prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path


def _file_task(model: Path, prompts: Path, *more: str) -> list[str]:
    return [f"model.path={model}", "data.task=jsonl", f"data.train_path={prompts}",
            "rollout.max_new_tokens=8", "data.max_prompt_tokens=16", *more]  # fmt: skip


def test_a_prompt_of_exactly_max_prompt_tokens_passes_and_one_token_more_is_refused(
    model_dir: Path, tmp_path: Path
) -> None:
    fits = " ".join(["what"] * 14)  # 16 tokens with the chat template's "user :", data.max_prompt_tokens
    good = _prompts(tmp_path / "fits.jsonl", ["what is 1", fits])
    check_inputs(load_config(None, _file_task(model_dir, good)), every_prompt=True)
    over = _prompts(tmp_path / "over.jsonl", ["what is 1", f"{fits} what"])
    with pytest.raises(DataError, match=r"prompt of 17 tokens exceeds data\.max_prompt_tokens \(16\)"):
        check_inputs(load_config(None, _file_task(model_dir, over)), every_prompt=True)


def test_a_directory_without_a_model_is_refused_naming_model_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^model\.path \(.*\) must be a local HF model directory"):
        check_inputs(load_config(None, [f"model.path={tmp_path}"]))


def test_a_broken_tokenizer_is_one_line_naming_model_path(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((model_dir / "config.json").read_text())
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match=r"^model\.path \(.*broken'\): its tokenizer does not load: ") as err:
        check_inputs(load_config(None, [f"model.path={broken}"]))
    assert "\n" not in str(err.value)


def test_a_missing_prompt_file_is_refused(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"prompt file '.*missing\.jsonl' does not exist"):
        check_inputs(load_config(None, _file_task(model_dir, tmp_path / "missing.jsonl")))


def test_every_prompt_is_encoded_only_when_asked(model_dir: Path, tmp_path: Path) -> None:
    long_prompt = " ".join(["what"] * 20)  # 20 words + the chat template's tokens > 16
    config = load_config(None, _file_task(model_dir, _prompts(tmp_path / "p.jsonl", ["1", long_prompt])))
    check_inputs(config)  # the cheap check (what `train` runs) reads the file, encodes nothing
    with pytest.raises(DataError, match=r"exceeds data\.max_prompt_tokens \(16\)"):
        check_inputs(config, every_prompt=True)


def test_the_model_shape_is_checked_against_layout_and_sequence_length(model_dir: Path) -> None:
    megatron_tp4 = [f"model.path={model_dir}", "engine.train=megatron", "parallel.train.tensor=4"]
    with pytest.raises(GRPOConfigError, match=r"^parallel\.train\.tensor \(4\) must divide the attention"):
        check_inputs(load_config(None, megatron_tp4))
    pp2 = [f"model.path={model_dir}", "engine.train=megatron", "parallel.train.pipeline=2"]
    with pytest.raises(GRPOConfigError, match=r"pipeline x virtual_pipeline \(2\) must divide the 1 layers"):
        check_inputs(load_config(None, pp2))
    with pytest.raises(DataError, match=r"holds 32 positions, fewer than .* \(41\)"):
        check_inputs(load_config(None, [f"model.path={model_dir}", "rollout.max_new_tokens=32"]))


def test_a_custom_verifier_that_does_not_import_is_refused() -> None:
    config = load_config(None, ["reward.custom={nope: no_such_module:score}", "reward.verifiers={nope: 1.0}"])
    with pytest.raises(RewardError, match=r"^reward\.custom\.nope \('no_such_module:score'\) cannot be"):
        check_inputs(config)


def test_machine_checks_cover_tensorboard_and_cpus() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(GRPOConfigError, match=r"^logging\.tensorboard \(true\) needs tensorboard"):
            check_machine(load_config(None, ["logging.tensorboard=true"]))
    check_machine(load_config(None, []))  # the default: TensorBoard only when installed
    with pytest.raises(GRPOConfigError, match=r"^resources\.num_cpus_per_worker \(64\): 2 workers reserve"):
        check_machine(load_config(None, ["resources.num_cpus_per_worker=64", "resources.use_ray=true"]))


def test_a_tokenizer_larger_than_the_embedding_is_refused(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    small = shutil.copytree(model_dir, tmp_path / "small")
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 4}))
    with pytest.raises(DataError, match=r"its tokenizer has 11 tokens and the model's embedding only 4"):
        check_inputs(load_config(None, [f"model.path={small}"]))


def test_lora_without_peft_is_refused_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # import machinery's "not installed"
    with pytest.raises(
        GRPOConfigError, match=r'^model\.lora\.rank \(8\) needs peft.*pip install "\./packages/grpo\[lora\]"'
    ):
        check_machine(load_config(None, ["model.lora.rank=8"]))
