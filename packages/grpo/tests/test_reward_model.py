"""Learned reward models: scores equal a direct HF forward for both layouts; bad dirs and texts raise."""

from __future__ import annotations

import json
import logging
from logging.handlers import BufferingHandler
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests_support_models import tiny_model_dir, tiny_reward_model_dir
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from entrepot.grpo.engines.reward_model import RewardModel, check_reward_model_dir, load_reward_model
from entrepot.grpo.errors import RewardModelError

# texts of 2, 6 and 16 tokens, so a batch pads the short ones
PROMPTS = ["what", "user : what is", "user : what is 1 ? user : what is"]
RESPONSES = [" is", " 2 ?", " 3 ? 3 2 1 ? user"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_reward_model_dir(tmp_path_factory.mktemp("classifier"))  # GPT-2, 32 positions


@pytest.fixture(scope="module")
def value_head_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_reward_model_dir(tmp_path_factory.mktemp("value_head"), kind="value_head")


def _token_ids(directory: Path, text: str) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])  # [1, L]


def _check_scores(scores: torch.Tensor, expected: list[torch.Tensor]) -> None:
    assert scores.dtype == torch.float32 and scores.device.type == "cpu" and scores.shape == (len(PROMPTS),)
    torch.testing.assert_close(scores, torch.stack(expected), atol=1e-5, rtol=0)
    assert len(set(scores.tolist())) == len(PROMPTS), "every text should get its own score"


@pytest.mark.parametrize("architecture", ["gpt2", "qwen2"])
def test_classifier_scores_equal_hf_logits_of_each_unpadded_text(tmp_path: Path, architecture: str) -> None:
    directory = tiny_reward_model_dir(tmp_path / "rm", architecture=architecture)
    reward_model = load_reward_model(directory)
    assert reward_model.kind == "classifier" and reward_model.path == str(directory)
    scores = reward_model.score(PROMPTS, RESPONSES)  # one padded micro-batch

    model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True).eval()
    with torch.no_grad():
        expected = [
            model(_token_ids(directory, p + r)).logits[0, 0] for p, r in zip(PROMPTS, RESPONSES, strict=True)
        ]
    _check_scores(scores, expected)


def test_value_head_scores_equal_head_on_last_hidden_state(value_head_dir: Path) -> None:
    records = BufferingHandler(capacity=1000)  # transformers' own handler writes past pytest's capture
    logging.getLogger("transformers.modeling_utils").addHandler(records)
    try:
        reward_model = load_reward_model(value_head_dir)
    finally:
        logging.getLogger("transformers.modeling_utils").removeHandler(records)
    reports = [r.getMessage() for r in records.buffer if "v_head" in r.getMessage()]
    assert not reports, "the v_head keys the causal LM does not expect should not be reported"
    assert reward_model.kind == "value_head"
    scores = reward_model.score(PROMPTS, RESPONSES)

    tensors = load_file(value_head_dir / "model.safetensors")
    weight, bias = tensors["v_head.summary.weight"], tensors["v_head.summary.bias"]  # [1, H], [1]
    model = AutoModelForCausalLM.from_pretrained(value_head_dir, local_files_only=True).eval()
    with torch.no_grad():
        expected = [
            model(_token_ids(value_head_dir, p + r), output_hidden_states=True).hidden_states[-1][0, -1]
            @ weight[0]
            + bias[0]
            for p, r in zip(PROMPTS, RESPONSES, strict=True)
        ]
    _check_scores(scores, expected)


@pytest.mark.parametrize("kind", ["classifier", "value_head"])
def test_micro_batch_size_does_not_change_scores(
    classifier_dir: Path, value_head_dir: Path, kind: str
) -> None:
    reward_model = load_reward_model(classifier_dir if kind == "classifier" else value_head_dir)
    prompts, responses = PROMPTS * 2, RESPONSES[::-1] * 2
    one_at_a_time = reward_model.score(prompts, responses, micro_batch=1)
    for micro_batch in (2, 16):
        scores = reward_model.score(prompts, responses, micro_batch=micro_batch)
        torch.testing.assert_close(scores, one_at_a_time, atol=1e-6, rtol=0)
    assert reward_model.score([], []).shape == (0,)


def test_parameters_are_the_backbone_and_the_value_head(value_head_dir: Path) -> None:
    reward_model = load_reward_model(value_head_dir)
    parameters = reward_model.parameters()
    assert len({id(p) for p in parameters}) == len(parameters)
    weight = load_file(value_head_dir / "model.safetensors")["v_head.summary.weight"]
    assert any(p.shape == weight.shape and torch.equal(p, weight) for p in parameters)
    backbone = AutoModelForCausalLM.from_pretrained(value_head_dir, local_files_only=True).base_model
    assert sum(p.numel() for p in parameters) == sum(p.numel() for p in backbone.parameters()) + 16 + 1
    assert isinstance(reward_model.to("cpu"), RewardModel)


def test_check_reward_model_dir_returns_the_kind(classifier_dir: Path, value_head_dir: Path) -> None:
    assert check_reward_model_dir(classifier_dir) == "classifier"
    assert check_reward_model_dir(value_head_dir) == "value_head"


def test_sharded_value_head_is_found_through_the_index(tmp_path: Path, value_head_dir: Path) -> None:
    directory = tmp_path / "sharded"
    directory.mkdir()
    for file in value_head_dir.iterdir():
        if file.name != "model.safetensors":
            (directory / file.name).write_bytes(file.read_bytes())
    from safetensors.torch import save_file

    tensors = load_file(value_head_dir / "model.safetensors")
    head = {key: tensors.pop(key) for key in ("v_head.summary.weight", "v_head.summary.bias")}
    save_file(tensors, directory / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(head, directory / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = {key: "model-00001-of-00002.safetensors" for key in tensors} | {
        key: "model-00002-of-00002.safetensors" for key in head
    }
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )

    assert check_reward_model_dir(directory) == "value_head"
    scores = load_reward_model(directory).score(PROMPTS, RESPONSES)
    torch.testing.assert_close(scores, load_reward_model(value_head_dir).score(PROMPTS, RESPONSES))


def _bad_dirs(root: Path, classifier_dir: Path) -> dict[str, Path]:
    """Directories that are not reward models, each with a phrase its error must contain."""
    no_config = root / "no_config"
    no_config.mkdir()
    two_labels = tiny_reward_model_dir(root / "two_labels")
    config = json.loads((two_labels / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1"}  # how HF stores num_labels=2
    (two_labels / "config.json").write_text(json.dumps(config))
    no_tokenizer = root / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((classifier_dir / name).read_bytes())
    return {
        "has no config.json": no_config,
        "holds no v_head.summary.weight": tiny_model_dir(root / "plain_lm"),
        "num_labels=2": two_labels,
        "tokenizer": no_tokenizer,
    }


def test_bad_directories_raise_naming_the_directory(tmp_path: Path, classifier_dir: Path) -> None:
    for phrase, directory in _bad_dirs(tmp_path, classifier_dir).items():
        for check in (check_reward_model_dir, load_reward_model):
            with pytest.raises(RewardModelError) as raised:
                check(directory)
            assert str(directory) in str(raised.value) and phrase in str(raised.value), str(raised.value)


def test_too_long_and_empty_texts_raise_naming_the_row(classifier_dir: Path) -> None:
    reward_model = load_reward_model(classifier_dir)  # 32 positions
    with pytest.raises(
        RewardModelError, match=r"row 1 of this call .* has 40 tokens; .* 32 positions"
    ) as raised:
        reward_model.score(["what", "what " * 39], [" is", " is"])
    assert str(classifier_dir) in str(raised.value)
    with pytest.raises(RewardModelError, match=r"row 2 of this call .* has no tokens") as raised:
        reward_model.score(["what", "is", ""], [" is", " 1", ""])
    assert str(classifier_dir) in str(raised.value)
