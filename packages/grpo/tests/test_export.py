"""`run.export`: a checkpoint as an HF directory that transformers and vLLM load with the trainer's log-probs.

The training runs are ``integration`` (two steps of the embedded default, one step of a tiny local
Qwen2); the vLLM test is ``vllm`` too (the tests-vllm session runs it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_vllm import needs_vllm
from tests_support_models import byte_tokenizer

from entrepot.grpo import load_config, train
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.engines.policy import initial_model
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run.export import char_tokenizer_as_hf, checkpoint_directory, export_checkpoint

QUICK = ["resources.use_ray=false", "logging.tensorboard=false", "eval.every=0", "eval.num_prompts=8",
         "rollout.prompts_per_step=4"]  # fmt: skip
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def _trainer_model(config: GRPOConfig, checkpoint: Path) -> torch.nn.Module:
    """The run's model with the checkpoint's training weights (what the trainer computed with)."""
    model, _ = initial_model(config)
    missing, unexpected = model.load_state_dict(
        load_file(str(checkpoint / "model.safetensors")), strict=False
    )
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


def _sequences(tokenizer: Any, texts: list[str]) -> ResponseBatch:
    """Each text as a prompt of its first two tokens and a response of the rest."""
    rows = [torch.tensor(tokenizer.encode(text, add_special_tokens=False)) for text in texts]
    prompts = torch.cat([row[:2] for row in rows])
    responses = torch.cat([row[2:] for row in rows])
    lengths = torch.tensor([len(row) for row in rows])
    return ResponseBatch.from_packed(prompts, torch.full_like(lengths, 2), responses, lengths - 2)


def _logprobs(model: torch.nn.Module, batch: ResponseBatch) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(model, batch, packed=False)[0]  # [R]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRPOConfig, Path]:
    """Two steps of the embedded default (its checkpoint after step 2)."""
    run = tmp_path_factory.mktemp("export") / "run"
    config = load_config(None, [*QUICK, "max_steps=2"])
    train(config, run)
    return config, run


def test_char_tokenizer_as_hf_keeps_ids_and_text() -> None:
    ours = CharTokenizer()
    theirs = char_tokenizer_as_hf(ours)
    assert len(theirs) == ours.vocab_size
    assert (theirs.pad_token_id, theirs.eos_token_id) == (ours.pad_token_id, ours.eos_token_id)
    ids = ours.encode("12+30=42")
    assert theirs.encode("12+30=42", add_special_tokens=False) == ids
    assert theirs.decode([*ids, ours.eos_token_id], skip_special_tokens=True) == "12+30=42"


def test_missing_run_or_step_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a run directory"):
        checkpoint_directory(tmp_path)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 5; it has \[2\]"):
        checkpoint_directory(tmp_path, 5)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoint_directory(tmp_path)  # step 2 has no manifest


@pytest.mark.integration
def test_default_export_loads_in_transformers_with_the_trainers_logprobs(
    default_run: tuple[GRPOConfig, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config, run = default_run
    out = export_checkpoint(run, 2, tmp_path / "hf")
    assert out == tmp_path / "hf" and {"config.json", "model.safetensors", "tokenizer.json"} <= set(
        os.listdir(out)
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    texts = ["12345678=87654321", "90+=", "00112233=33221100"]
    assert [tokenizer.encode(t, add_special_tokens=False) for t in texts] == [
        CharTokenizer().encode(t) for t in texts
    ]
    batch = _sequences(tokenizer, texts)
    expected = _logprobs(_trainer_model(config, run / "checkpoints" / "step_000002"), batch)
    torch.testing.assert_close(_logprobs(model, batch), expected, atol=1e-5, rtol=0)
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_checkpoint(run, 2, out)
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 1; it has \[2\]"):
        export_checkpoint(run, 1)


@pytest.mark.integration
def test_local_qwen2_export_keeps_the_chat_template(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    source = tmp_path / "qwen2"
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(source)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0,
        eos_token_id=1, bos_token_id=1,
    )).save_pretrained(source)  # fmt: skip
    overrides = [f"model.path={source}", "data.num_digits=4", "rollout.prompts_per_step=2",
                 "rollout.n_samples_per_prompt=2", "max_steps=1"]  # fmt: skip
    config = load_config(None, [*QUICK, *overrides])
    train(config, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run")
    assert out == tmp_path / "run" / "export" / "step_000001"
    exported = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "12"}]
    assert exported.chat_template == CHAT_TEMPLATE
    assert exported.apply_chat_template(messages, tokenize=False) == "<|user|>12<|assistant|>"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    batch = _sequences(exported, ["12=21", "345=543"])
    expected = _logprobs(_trainer_model(config, tmp_path / "run" / "checkpoints" / "step_000001"), batch)
    torch.testing.assert_close(_logprobs(model, batch), expected, atol=1e-5, rtol=0)


@pytest.mark.integration
def test_lora_export_is_the_checkpoints_merged_model_with_a_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lora = ["model.lora.rank=4", "model.lora.target_modules=[c_attn]", "max_steps=1"]
    train(load_config(None, [*QUICK, *lora]), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run")
    assert AutoTokenizer.from_pretrained(out).encode(
        "12", add_special_tokens=False
    ) == CharTokenizer().encode("12")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    merged = load_file(str(tmp_path / "run" / "checkpoints" / "step_000001" / "hf" / "model.safetensors"))
    state = model.state_dict()
    assert merged and all(torch.equal(state[name], tensor) for name, tensor in merged.items())
    assert (out / "adapter" / "adapter_config.json").is_file()  # peft's adapter, beside the merged model


@needs_vllm
@pytest.mark.integration
def test_default_export_loads_in_vllm_with_the_trainers_prompt_logprobs(
    default_run: tuple[GRPOConfig, Path], tmp_path: Path
) -> None:
    import vllm

    config, run = default_run
    out = export_checkpoint(run, 2, tmp_path / "hf")
    texts = ["12345678=87654321", "00112233=33221100"]
    rows = [CharTokenizer().encode(t) for t in texts]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
        llm = vllm.LLM(
            model=str(out), dtype="float32", max_model_len=32, max_num_seqs=4, enforce_eager=True, seed=0
        )
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
        outputs = llm.generate([{"prompt_token_ids": row} for row in rows], params, use_tqdm=False)
        assert llm.get_tokenizer().encode(texts[0], add_special_tokens=False) == rows[0]
        del llm
    got = torch.tensor([
        entry[token].logprob for output, row in zip(outputs, rows, strict=True)
        for entry, token in zip(output.prompt_logprobs[2:], row[2:], strict=True)
    ])  # fmt: skip  # [R]: the tokens after each row's first two, as `_sequences` splits them
    batch = _sequences(CharTokenizer(), texts)
    trainer_logp = _logprobs(_trainer_model(config, run / "checkpoints" / "step_000002"), batch)
    torch.testing.assert_close(got, trainer_logp, atol=1e-4, rtol=0)
