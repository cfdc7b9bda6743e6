"""`rl grpo check-template DIR`: exit 0 when the chat template is append-only, 1 naming the turn, 2 for a
bad directory.

The check itself is tested in entrepot-grpo's tests/test_template_check.py; the tokenizer directories
here are written by the test (byte-level, ChatML special tokens), no downloads.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from entrepot.cli.app import app

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ CONTENT }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GOOD = CHATML.replace("{{ CONTENT }}", "{{ m['content'] }}")
# Earlier assistant messages lose their first character once a message follows them.
BAD = CHATML.replace(
    "{{ CONTENT }}",
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'][1:] }}{% else %}{{ m['content'] }}"
    "{% endif %}",
)


def _model_dir(path: Path, chat_template: str) -> Path:
    """A byte-level Qwen2 tokenizer (<|im_end|> the EOS token) with `chat_template`, and a config.json."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, **{symbol: i + 1 for i, symbol in enumerate(byte_symbols)}}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<pad>", unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def test_append_only_template_exits_0(runner: CliRunner, tmp_path: Path) -> None:
    model = _model_dir(tmp_path, GOOD)
    result = runner.invoke(app, ["grpo", "check-template", str(model)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("append-only: 5 turns, ") and f"tokens ({model})" in result.stdout


def test_rewriting_template_exits_1_naming_the_turn(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["grpo", "check-template", str(_model_dir(tmp_path, BAD))])
    assert result.exit_code == 1, result.output
    assert "turn 2 of 5 (tool)" in result.stdout and "renders the assistant turn" in result.stdout


def test_environment_role_option(runner: CliRunner, tmp_path: Path) -> None:
    refuses_tools = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{% endfor %}" + GOOD
    )
    model = str(_model_dir(tmp_path, refuses_tools))
    result = runner.invoke(app, ["grpo", "check-template", model])
    assert result.exit_code == 1 and "cannot render a 'tool' message: no tools" in result.stdout
    result = runner.invoke(app, ["grpo", "check-template", model, "--role", "user"])
    assert result.exit_code == 0, result.output


def test_missing_directory_exits_2_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["grpo", "check-template", str(tmp_path / "nowhere")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "must be a local HF model directory with config.json" in result.stderr


def test_tokenizer_without_chat_template_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    model = _model_dir(tmp_path, GOOD)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    for template_file in model.glob("chat_template.*"):
        template_file.unlink()
    result = runner.invoke(app, ["grpo", "check-template", str(model)])
    assert result.exit_code == 2, result.output
    assert "no chat template" in result.stderr
