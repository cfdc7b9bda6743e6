"""LoRA on the torch engine (peft): only the adapters train, the rollout engine and the HF export get
the merged weights, and the export loads in transformers with the trainer's log-probs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.algo.update import UpdateInputs, ppo_update
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.engines.lora import apply_lora, merged_hf_weights
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.engines.policy import build_policy, export_hf
from entrepot.grpo.errors import GRPOConfigError

pytest.importorskip("peft")

VOCAB = 16
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "algorithm.kl_coef=0"]


def _batch() -> ResponseBatch:
    gen = torch.Generator().manual_seed(0)
    prompts, responses = torch.tensor([5, 4, 6]), torch.tensor([3, 2, 4])
    return ResponseBatch.from_packed(torch.randint(2, VOCAB, (15,), generator=gen), prompts,
                                     torch.randint(2, VOCAB, (9,), generator=gen), responses)  # fmt: skip


def _trained(config: GRPOConfig, lora: bool) -> tuple[torch.nn.Module, torch.nn.Module, int]:
    """A model (LoRA-wrapped or not) after one update; its initial copy; its optimizer's state bytes."""
    torch.manual_seed(0)
    model = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
    initial = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
    initial.load_state_dict(model.state_dict())
    if lora:
        model = apply_lora(model, config.model.lora)
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=10)
    batch = _batch()
    inputs = UpdateInputs(batch, torch.tensor([1.0, -1.0, 0.5]), None, None, [torch.arange(3)])
    ppo_update(model, optimizer, scheduler, inputs, config.algorithm, config.batching)
    state = optimizer.state_dict()["state"].values()
    nbytes = sum(t.numel() * t.element_size() for s in state for t in s.values() if torch.is_tensor(t))
    return model, initial, nbytes


def test_only_the_adapters_train_and_hold_optimizer_state() -> None:
    config = load_config(None, LORA)
    model, initial, lora_bytes = _trained(config, lora=True)
    _, _, full_bytes = _trained(load_config(None, ["algorithm.kl_coef=0"]), lora=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    base = model.get_base_model()  # type: ignore[operator]
    frozen = {n.replace(".base_layer.", "."): p for n, p in base.named_parameters() if ".lora_" not in n}
    for name, before in initial.named_parameters():
        assert torch.equal(frozen[name], before), name  # the base never moves
    assert any(float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if ".lora_B." in n)
    assert 0 < lora_bytes < full_bytes / 4, (lora_bytes, full_bytes)


def test_merged_weights_give_the_adapted_models_log_probs() -> None:
    config = load_config(None, LORA)
    model, _, _ = _trained(config, lora=True)
    plain = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
    plain.load_state_dict(merged_hf_weights(model), strict=False)
    batch, initial_model = _batch(), _trained(config, lora=False)[1]
    with torch.no_grad():
        adapted, _ = response_logprobs(model, batch, packed=True)
        merged, _ = response_logprobs(plain, batch, packed=True)
        initial, _ = response_logprobs(initial_model, batch, packed=True)
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    assert float((adapted - initial).abs().max()) > 1e-4  # the adapters changed the function


def test_the_rollout_engine_and_the_hf_export_get_the_merged_weights(tmp_path: Path) -> None:
    """`build_policy` with LoRA: after an update the embedded engine generates with W + BA, and the HF
    export (merged model + adapter) loads in transformers and peft with the trainer's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = load_config(None, ["model.lora.rank=4", "model.lora.target_modules=[c_attn,c_fc]"])
    policy = build_policy(config)
    model = policy.trainer.model  # type: ignore[attr-defined]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.2)  # as if trained
    policy.manager.enter_infer_mode()
    try:
        engine_weights = policy.engine.hf_weights()
        export_hf(policy, tmp_path / "hf")
    finally:
        policy.manager.exit_infer_mode()
    assert policy.trainer.save_adapter(tmp_path / "hf" / "adapter")
    merged = merged_hf_weights(model)
    for name, weight in engine_weights.items():
        torch.testing.assert_close(weight, merged[name], atol=0, rtol=0, msg=name)
    vocab = int(policy.hf_config.vocab_size)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, vocab, (12,), generator=gen)
    responses = torch.randint(2, vocab, (8,), generator=gen)
    batch = ResponseBatch.from_packed(prompts, torch.tensor([6, 6]), responses, torch.tensor([5, 3]))
    with torch.no_grad():
        ours = policy.trainer.logprobs(batch, "old_log_prob", reference=False)
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        theirs, _ = response_logprobs(exported, batch, packed=False)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), tmp_path / "hf" / "adapter"
    )
    saved = {n: p for n, p in adapter.named_parameters() if ".lora_" in n}
    trained = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    assert saved.keys() == trained.keys() and all(torch.equal(saved[n], trained[n]) for n in saved)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.lora.rank=-1"], "model.lora.rank"),
        (["model.lora.alpha=0"], "model.lora.alpha"),
        (["model.lora.dropout=1.0"], "model.lora.dropout"),
        (["model.lora.target_modules=[]"], "model.lora.target_modules"),
        (["model.lora.target_modules=c_attn"], "model.lora.target_modules"),
        (["model.lora.rank=8", "engine.train=megatron"], "model.lora.rank"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)
