"""The embedded default policy: HF GPT-2's config and parameters, held without importing transformers.

Importing transformers lengthens the default run's start-up, before its first step: its import
structure scan, and for its models torch.distributed.tensor and more (`bench_grpo.py --vs-trl`
prints the start-up). The default run needs none
of that code: its log-prob and update passes are written out on the weights
(`entrepot.grpo.embedded.gpt2_forward`), and its rollout engine keeps its own layout. So `EmbeddedGPT2`
holds the parameters under HF's names and layout (Conv1D weights [in, out], tied embeddings),
initialised exactly as HF's `GPT2LMHeadModel` is for the same seed (tested equal), and
`EmbeddedGPT2Config` holds GPT2Config's fields under its names (`to_hf()` gives HF's).

Whatever needs HF's module (a padded forward, `save_pretrained` for vLLM, a test against HF) calls
it through `hf_view()`: an HF `GPT2LMHeadModel` built on first use around this module's own layers
(embeddings, LayerNorms, Conv1Ds, LM head), so training either one trains both, and a hook on a
layer sees both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["EmbeddedGPT2", "EmbeddedGPT2Config", "as_hf_config", "hf_architecture"]

ARCHITECTURE = "GPT2LMHeadModel"


def hf_architecture(model: nn.Module) -> str:
    """The HF architecture name of `model` (``GPT2LMHeadModel`` for an `EmbeddedGPT2`), for adaptors."""
    return str(getattr(model, "hf_architecture", type(model).__name__))


def as_hf_config(config: Any) -> Any:
    """HF's config object for `config` (an `EmbeddedGPT2Config` converted; an HF config as it is)."""
    return config.to_hf() if isinstance(config, EmbeddedGPT2Config) else config


@dataclass
class EmbeddedGPT2Config:
    """The fields of HF's `GPT2Config` that a GPT-2 without dropout uses, under HF's names.

    Code that reads a model's config by attribute (engines, adaptors, megatron's conversion) reads it
    as it reads HF's; `to_hf()` gives HF's `GPT2Config` (which imports transformers) where a library
    needs the real one.
    """

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None = None
    activation_function: str = "gelu"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    embd_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    tie_word_embeddings: bool = True
    model_type: ClassVar[str] = "gpt2"
    architectures: ClassVar[list[str]] = [ARCHITECTURE]
    _attn_implementation: ClassVar[str] = "eager"  # what HF's forward of the model (`hf_view`) uses

    # HF's names for the same sizes (GPT2Config's attribute_map)
    hidden_size = property(lambda self: self.n_embd)
    num_attention_heads = property(lambda self: self.n_head)
    num_hidden_layers = property(lambda self: self.n_layer)
    max_position_embeddings = property(lambda self: self.n_positions)

    def to_hf(self) -> Any:
        """HF's `GPT2Config` with these fields (eager attention)."""
        from transformers import GPT2Config

        fields = dataclasses.asdict(self)
        return GPT2Config(**fields, attn_implementation=self._attn_implementation)


class _Conv1D(nn.Module):
    """HF's Conv1D: weight [in, out] (a transposed Linear), bias [out]."""

    def __init__(self, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])


class _Attention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.c_attn = _Conv1D(3 * hidden, hidden)
        self.c_proj = _Conv1D(hidden, hidden)


class _MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.c_fc = _Conv1D(inner, hidden)
        self.c_proj = _Conv1D(hidden, inner)


class _Block(nn.Module):
    def __init__(self, hidden: int, inner: int, eps: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = _Attention(hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = _MLP(hidden, inner)


class _Transformer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, eps = config.n_embd, config.layer_norm_epsilon
        inner = config.n_inner or 4 * hidden
        self.wte = nn.Embedding(config.vocab_size, hidden, _weight=torch.empty(config.vocab_size, hidden))
        self.wpe = nn.Embedding(config.n_positions, hidden, _weight=torch.empty(config.n_positions, hidden))
        self.h = nn.ModuleList(_Block(hidden, inner, eps) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(hidden, eps=eps)


class EmbeddedGPT2(nn.Module):
    """GPT-2 with tied embeddings and no dropout, in HF's parameter names.

    Args:
        config: an `EmbeddedGPT2Config` (what `entrepot.grpo.engines.models.model_config` builds) or an HF
            `GPT2Config`, with `tie_word_embeddings` and zero dropout; anything else raises ValueError.
    """

    hf_architecture = ARCHITECTURE

    def __init__(self, config: Any) -> None:
        super().__init__()
        dropout = {key: getattr(config, key) for key in ("embd_pdrop", "resid_pdrop", "attn_pdrop")}
        if not config.tie_word_embeddings or any(dropout.values()):
            raise ValueError(
                f"EmbeddedGPT2 holds tied embeddings and no dropout; config has tie_word_embeddings="
                f"{config.tie_word_embeddings}, {dropout}: build such a model with HF's GPT2LMHeadModel"
            )
        self.config = config
        self.transformer = _Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, device="meta")
        self.lm_head.weight = self.transformer.wte.weight  # tied, as HF's
        self._initialise(config.initializer_range)

    @torch.no_grad()
    def _initialise(self, std: float) -> None:
        """HF's initial weights for the same seed: the same draws, in the same order.

        HF's `GPT2Model` constructors draw first (embeddings N(0, 1), each Conv1D N(0, 0.02)); its
        `post_init` draws every weight again, children before parents: embeddings and Conv1Ds
        N(0, std), after which each block's attention and MLP redraw their `c_proj` at
        std / sqrt(2 * layers) (GPT-2's residual scaling). Then the LM head's Linear draws its own
        weight twice (its constructor, then `post_init`) before being tied to the embedding. Only
        the last draw of a weight is kept; the others are replayed so that the random stream
        advances as HF's does (what a run draws next is the same too).
        """
        weights = {name.removesuffix(".weight"): p for name, p in self.named_parameters()}
        layers = range(self.config.n_layer)
        scaled = std / math.sqrt(2 * self.config.n_layer)
        weights["transformer.wte"].normal_(0.0, 1.0)
        weights["transformer.wpe"].normal_(0.0, 1.0)
        for i in layers:
            for conv in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                weights[f"transformer.h.{i}.{conv}"].normal_(0.0, 0.02)
        weights["transformer.wte"].normal_(0.0, std)
        weights["transformer.wpe"].normal_(0.0, std)
        for i in layers:
            for first, projection in (("attn.c_attn", "attn.c_proj"), ("mlp.c_fc", "mlp.c_proj")):
                weights[f"transformer.h.{i}.{first}"].normal_(0.0, std)
                weights[f"transformer.h.{i}.{projection}"].normal_(0.0, std)
                weights[f"transformer.h.{i}.{projection}"].normal_(0.0, scaled)
        untied_head = torch.empty_like(weights["transformer.wte"])
        nn.init.kaiming_uniform_(untied_head, a=math.sqrt(5))  # nn.Linear's own initialisation
        untied_head.normal_(0.0, std)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (HF's accessor)."""
        return self.transformer.wte

    def hf_view(self) -> nn.Module:
        """HF's `GPT2LMHeadModel` around this module's layers (built on first use, and again if replaced).

        It reads `config` when it is built: set config fields before the first call that uses it.
        """
        layers = tuple((name, m) for name, m in self.named_modules() if name and not any(m.children()))
        key = tuple(id(m) for _, m in layers)
        view: Any = self.__dict__.get("_hf_view")
        if view is None or self.__dict__.get("_hf_view_of") != key:
            from transformers import GPT2LMHeadModel

            with torch.device("meta"):  # no memory and no draws: every layer with weights is replaced
                view = GPT2LMHeadModel(as_hf_config(self.config))
            for name, layer in layers:
                owner, _, leaf = name.rpartition(".")
                setattr(view.get_submodule(owner), leaf, layer)
            # plain attributes, not submodules: the view must not appear in this module's parameters
            self.__dict__["_hf_view"], self.__dict__["_hf_view_of"] = view, key
        view.train(self.training)
        return view

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """HF's forward (any of `GPT2LMHeadModel`'s arguments; returns its output with `.logits`)."""
        view: Any = self.hf_view()
        return view(*args, **kwargs)

    def save_pretrained(self, directory: str | Path, **kwargs: Any) -> None:
        """Write an HF model directory (`AutoModelForCausalLM.from_pretrained` loads it)."""
        view: Any = self.hf_view()
        view.save_pretrained(directory, **kwargs)
