"""The embedded default policy: HF GPT-2's config, weights and forward, without importing transformers."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from entrepot.grpo import load_config
from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2, EmbeddedGPT2Config, hf_architecture
from entrepot.grpo.engines.models import build_hf_config, build_model, model_config

VOCAB = 16


def _config(*overrides: str) -> object:
    return build_hf_config(load_config(None, list(overrides)).model, VOCAB, pad_token_id=0, eos_token_id=1)


OTHER_SHAPE = ("model.num_layers=3", "model.intermediate_size=96", "model.init_std=0.05",
               "model.max_positions=48")  # fmt: skip


@pytest.mark.parametrize("overrides", [(), OTHER_SHAPE], ids=["default", "other-shape"])
@pytest.mark.parametrize("seed", [0, 7])
def test_the_same_seed_gives_hf_gpt2_weights(overrides: tuple[str, ...], seed: int) -> None:
    config = _config(*overrides)
    torch.manual_seed(seed)
    ours = EmbeddedGPT2(config)
    after_ours = torch.random.get_rng_state()
    torch.manual_seed(seed)
    theirs = AutoModelForCausalLM.from_config(config)
    assert torch.equal(after_ours, torch.random.get_rng_state())  # what is drawn next is the same too
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    assert ours.lm_head.weight is ours.transformer.wte.weight


def test_its_hf_view_shares_the_parameters_and_trains_them() -> None:
    torch.manual_seed(0)
    model = build_model(load_config(None, []).model, VOCAB, pad_token_id=0, eos_token_id=1)
    assert isinstance(model, EmbeddedGPT2) and hf_architecture(model) == "GPT2LMHeadModel"
    view = model.hf_view()
    assert isinstance(view, GPT2LMHeadModel) and model.hf_view() is view
    ours = dict(model.named_parameters())
    assert all(param is ours[name] for name, param in view.named_parameters())
    assert list(view.parameters()) and len(list(model.parameters())) == len(list(view.parameters()))
    ids = torch.tensor([[2, 3, 4, 5], [6, 7, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    copied = copy.deepcopy(model)  # the reference: its own parameters, and a view around those
    copied_ids = {id(p) for p in copied.hf_view().parameters()}
    assert copied_ids == {id(p) for p in copied.parameters()}
    assert not copied_ids & {id(p) for p in ours.values()}
    model.eval()
    assert not model.hf_view().training


def test_save_pretrained_writes_a_directory_hf_loads(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = EmbeddedGPT2(_config())
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    ids = torch.tensor([[2, 3, 4, 5]])
    # the loaded model attends with sdpa, ours with eager: equal to float32 rounding
    torch.testing.assert_close(model(input_ids=ids).logits, loaded(input_ids=ids).logits, rtol=0, atol=1e-6)


def test_its_config_reads_as_hf_gpt2_config() -> None:
    settings = load_config(None, ["model.intermediate_size=96"]).model
    ours = model_config(settings, VOCAB, pad_token_id=0, eos_token_id=1)
    theirs = build_hf_config(settings, VOCAB, pad_token_id=0, eos_token_id=1)
    assert isinstance(ours, EmbeddedGPT2Config) and type(theirs).__name__ == "GPT2Config"
    aliases = ["hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings"]
    for name in [*vars(ours), *aliases, "model_type", "_attn_implementation"]:
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("key, value", [("tie_word_embeddings", False), ("resid_pdrop", 0.1)])
def test_a_config_it_does_not_hold_is_refused(key: str, value: object) -> None:
    config = _config()
    setattr(config, key, value)
    with pytest.raises(ValueError, match=key):
        EmbeddedGPT2(config)


@pytest.mark.integration  # a training run in a subprocess
def test_the_default_run_imports_neither_transformers_nor_tensordict_nor_dynamo(tmp_path: Path) -> None:
    """Only paths that need transformers, tensordict or torch._dynamo import them; the default run
    (steps, evals, a checkpoint) needs none (torch.optim's optimizers would import torch._dynamo)."""
    overrides = ["max_steps=2", "eval.every=1", "checkpoint.save_every=1"]
    script = (
        "import sys\n"
        "from entrepot.grpo import load_config, train\n"
        f"train(load_config(None, {overrides!r}), {str(tmp_path / 'run')!r})\n"
        "print(sorted(m for m in ('tensordict', 'transformers', 'torch._dynamo') if m in sys.modules))\n"
    )
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
