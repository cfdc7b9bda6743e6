"""docs/models.md's walkthrough runs as written: validate, train, samples, export, load.

The test writes what a user brings to the paths the walkthrough names: a tiny Qwen2 whose byte-level
BPE tokenizer is trained here with `tokenizers` (and given a chat template), and a GSM8K-format jsonl.
Then it runs that section's bash block unchanged, from a folder whose `packages` is the checkout's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # subprocesses and a training run

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"
PACKAGES = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _walkthrough() -> str:
    section = PAGE.read_text().split("## Train on your own model and data", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None, "the walkthrough's bash block"
    return match.group(1)


def _gsm8k_rows(count: int) -> list[dict[str, str]]:
    rows = []
    for i in range(count):
        a, b = 3 + i % 17, 5 + i % 11
        question = f"Sam has {a} apples and buys {b} more. How many apples does Sam have now?"
        answer = f"Sam has {a} + {b} = {a + b} apples.\n#### {a + b}"
        rows.append({"question": question, "answer": answer})
    return rows


def _user_files(root: Path) -> None:
    """models/my-small-lm (tiny Qwen2 + trained BPE tokenizer + chat template) and data/train.jsonl."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rows = _gsm8k_rows(120)
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    special = ["<pad>", "<eos>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, initial_alphabet=alphabet)
    bpe.train_from_iterator([r["question"] + " " + r["answer"] for r in rows], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    model_dir = root / "models" / "my-small-lm"
    tokenizer.save_pretrained(model_dir)
    config = Qwen2Config(  # an embedding with spare rows, as models have
        vocab_size=len(tokenizer) + 8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(model_dir)


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    _user_files(tmp_path)
    (tmp_path / "packages").symlink_to(PACKAGES)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "COLUMNS": "160"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this venv's rl and python
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _walkthrough()], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert ": ok (" in done.stdout  # validate
    run = next((tmp_path / "runs").glob("mine-*"))
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all("#### " in s["answer"] and "<|user|>" in s["prompt"] for s in samples)
    exported = run / "export" / "step_000004"
    assert (exported / "config.json").is_file() and (exported / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(exported).chat_template == CHAT_TEMPLATE
