"""LoRA on the torch engine through peft: adapters on a frozen base, merged weights for the rollout.

`apply_lora` wraps the policy in peft's `PeftModel` (the embedded GPT-2 is first rebuilt as HF's
`GPT2LMHeadModel` with the same weights: peft knows HF's layers, not ours). Only the adapters
require gradients, so the optimizer (`algo.optim.build_optimizer`) holds state for them alone.
`LoraTrainingEngine` gives the resharding path the merged weights W + (alpha / r) B A under the
HF names, so every rollout engine (embedded, HF, vLLM) loads a plain model: the adapters are
never sent alone (vLLM's adapter loading is not used; see the grpo package's docs/engines.md, LoRA).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo.config import LoraConfig
from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2, as_hf_config, hf_architecture
from entrepot.resharding.engines.torch import TorchTrainingEngine

__all__ = ["LoraTrainingEngine", "apply_lora", "is_lora", "merged_hf_weights", "save_adapter"]


def apply_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """`model` with peft LoRA adapters (B = 0: the same function as `model` until it trains)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    base = _hf_module(model)
    gpt2 = hf_architecture(base) == "GPT2LMHeadModel"
    config = PeftLoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
        target_modules=lora.target_modules, fan_in_fan_out=gpt2,  # GPT-2's Conv1D holds W transposed
        modules_to_save=lora.modules_to_save or None,
    )  # fmt: skip
    with warnings.catch_warnings():  # peft asks transformers a deprecated question; not the user's
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(base, config)
    _tie_trained_embeddings(model)
    return model


def _tie_trained_embeddings(model: Any) -> None:
    """A tied input embedding in `modules_to_save` trains one copy: the LM head must read that copy too."""
    base = model.get_base_model()
    tied = getattr(base.config, "tie_word_embeddings", False)
    embeddings, head = base.get_input_embeddings(), base.get_output_embeddings()
    trained = getattr(embeddings, "modules_to_save", None)
    if tied and trained is not None and head is not None:
        head.weight = trained["default"].weight


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft model (its written-out fast paths do not see the adapters)."""
    return getattr(model, "peft_config", None) is not None and hasattr(model, "get_base_model")


def _hf_module(model: torch.nn.Module) -> torch.nn.Module:
    """HF's own module for `model`: the embedded GPT-2 rebuilt as `GPT2LMHeadModel`, others as they are."""
    if not isinstance(model, EmbeddedGPT2):
        return model
    from transformers import AutoModelForCausalLM

    with torch.device(next(model.parameters()).device):
        hf: Any = AutoModelForCausalLM.from_config(as_hf_config(model.config))
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(name != "lm_head.weight" for name in missing):
        raise RuntimeError(
            f"LoRA: the embedded GPT-2 does not map onto HF's: missing {missing}, unexpected {unexpected}"
        )
    hf.tie_weights()
    return hf.train(model.training)


@torch.no_grad()
def merged_hf_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of a LoRA `model` merged (W + scale B A) under the base model's HF names."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    base: Any = model.get_base_model()  # type: ignore[operator]
    merged: dict[str, torch.Tensor] = {}
    for name, param in base.named_parameters(remove_duplicate=False):
        if ".lora_" not in name and ".modules_to_save." not in name:
            merged[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = param.detach()
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            merged[f"{name}.weight"] = weight + module.get_delta_weight("default").to(weight.dtype)
        elif isinstance(module, ModulesToSaveWrapper):  # trained in full: its trained copy
            for leaf, param in module.modules_to_save["default"].named_parameters():
                merged[f"{name}.{leaf}"] = param.detach()
    return merged


def save_adapter(model: torch.nn.Module, directory: str | Path) -> None:
    """peft's adapter directory (adapter_config.json, adapter_model.safetensors) of a LoRA `model`."""
    from entrepot.grpo.engines.policy import quiet_hf_progress

    with quiet_hf_progress():
        model.save_pretrained(str(directory))  # type: ignore[operator]


class LoraTrainingEngine(TorchTrainingEngine):
    """The resharding path's view of a LoRA policy: the merged weights, in training layout."""

    def named_train_parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.adaptor.hf_to_train(merged_hf_weights(self.module)))
