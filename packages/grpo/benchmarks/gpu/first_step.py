"""Section (d): time from the start of `rl grpo train` to its first finished step, on the benchmark's model.

The section writes what a user would bring, with nothing downloaded: a local HF model directory
(the Qwen3 shape with random weights, saved with `save_pretrained`, and a byte-level BPE tokenizer
trained here with `tokenizers`, its vocabulary filled up to the model's with unused tokens, wrapped
in transformers' `PreTrainedTokenizerFast` with a chat template) and a small jsonl dataset of
arithmetic questions. It then starts the CLI (`first_step.yaml` plus overrides) in a child process
and polls the run's metrics.jsonl until the line of step 1 appears; the child is then stopped (the
end-of-run evaluation and checkpoint are not part of the figure).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import Shape, thread_env
from train_step import build_hf_model, release

CONFIG = Path(__file__).with_name("first_step.yaml")
# The CLI's entry point as the `rl` script calls it (the script itself may not be installed).
RL = [sys.executable, "-c", "from entrepot.cli.app import main; main()"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _questions(num: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        rows.append({"question": f"What is {a} + {b}? Answer after ####.", "answer": str(a + b)})
    return rows


def train_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """A byte-level BPE trained on `corpus`, its vocabulary filled with unused tokens up to `vocab_size`.

    Ids 0 and 1 are <|pad|> and <|endoftext|> (EOS); the filler tokens are never produced by
    encoding but decode to themselves, so any id the model samples is a valid token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 600), special_tokens=["<|pad|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    backend.train_from_iterator(corpus, trainer)
    data = json.loads(backend.to_str())
    vocab = data["model"]["vocab"]
    for index in range(vocab_size - len(vocab)):
        vocab[f"<|unused_{index}|>"] = len(vocab)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), pad_token="<|pad|>", eos_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_inputs(shape: Shape, directory: Path, device: torch.device) -> dict[str, Any]:
    """The model directory and dataset under `directory`; seconds spent writing them."""
    start = time.perf_counter()
    rows = _questions(256)
    data = directory / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model_dir = directory / "model"
    tokenizer = train_tokenizer([r["question"] + " #### " + r["answer"] for r in rows], shape.vocab)
    tokenizer.save_pretrained(model_dir)
    model = build_hf_model(shape, device, torch.bfloat16, packed=False)
    model.config.pad_token_id = None  # Qwen3 would make it the embedding's padding row
    model.config.eos_token_id = model.config.bos_token_id = tokenizer.eos_token_id
    model.save_pretrained(model_dir)
    del model
    release(device)
    return {"model_dir": str(model_dir), "data": str(data), "seconds": time.perf_counter() - start,
            "tokenizer_size": len(tokenizer)}  # fmt: skip


def _first_step_line(runs: Path) -> dict[str, Any] | None:
    for metrics in runs.glob("*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            if line.strip() and json.loads(line).get("step") == 1:
                return dict(json.loads(line))
    return None


def time_first_step(shape: Shape, directory: Path, device: torch.device, overrides: list[str],
                    timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """Start `rl grpo train`; the seconds until step 1's metrics line (the child is then stopped)."""
    inputs = write_inputs(shape, directory, device)
    runs = directory / "runs"
    command = [*RL, "grpo", "train", "--config", str(CONFIG), "-o", str(runs),
               f"model.path={inputs['model_dir']}", f"data.train_path={inputs['data']}",
               f"engine.device={device.type}", *overrides]  # fmt: skip
    log = directory / "rl.log"
    with log.open("w") as out:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=thread_env())
        line = None
        while line is None and child.poll() is None and time.perf_counter() - start < timeout_s:
            time.sleep(0.05)
            line = _first_step_line(runs)
        seconds = time.perf_counter() - start
        if child.poll() is None:
            child.kill()
        child.wait()
    line = line or _first_step_line(runs)
    result: dict[str, Any] = {"command": " ".join(command), "inputs": inputs, "exit_code": child.returncode}
    if line is None:
        tail = log.read_text()[-3000:]
        return {**result, "seconds_to_first_step": None, "log_tail": tail}
    timings = {k: v for k, v in line.items() if k.startswith("time/") or k == "reward_mean"}
    return {**result, "seconds_to_first_step": seconds, "step_metrics": timings}
