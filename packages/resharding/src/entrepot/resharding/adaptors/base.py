"""``WeightAdaptor``: one model family's name maps between the HF, training and inference layouts.

Three layouts of the same weights:

* ``hf``: Hugging Face checkpoint names (``model.layers.{}.self_attn.q_proj.weight``); the
  in-memory fused expert tensors of transformers 5 (``mlp.experts.gate_up_proj``) are read too.
* ``train``: megatron-core ``GPTModel`` names (local spec) with global layer and expert indices
  (``decoder.layers.{}.self_attention.linear_qkv.weight``, per-group interleaved QKV, ``linear_fc1``
  = ``[gate; up]``, ``mlp.experts.local_experts.{e}.linear_fc1.weight``).
* ``infer``: vLLM's fused names (``self_attn.qkv_proj`` = ``[Q; K; V]``, ``mlp.gate_up_proj``,
  stacked ``mlp.experts.w13_weight`` / ``w2_weight``).

``train_to_infer`` works on full tensors and on TP-sharded ones alike, which is what lets the
``Resharder`` move training-layout shards and convert each rank's shard locally.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from entrepot.resharding.adaptors._rules import Rule, convert, fill
from entrepot.resharding.adaptors.layouts import shard_dim, unshard_dim
from entrepot.resharding.errors import LayoutError, ShapeMismatchError, UnknownWeightError
from entrepot.resharding.layout import ParallelLayout, stage_of_layer

__all__ = ["ModelDims", "ParamSpec", "WeightAdaptor"]


@dataclass(frozen=True)
class ParamSpec:
    """How a training-layout parameter is split by tensor and expert parallelism.

    Attributes:
        tp_dim: the dim split across TP ranks; ``None`` = replicated on every TP rank.
        fused_chunks: blocks fused along ``tp_dim`` that are split separately (2 for
            ``linear_fc1`` = ``[gate; up]``: the TP shard i is ``[gate_i; up_i]``).
        expert: the global expert index of an expert parameter, else ``None``.
    """

    tp_dim: int | None
    fused_chunks: int = 1
    expert: int | None = None

    @property
    def is_expert(self) -> bool:
        """True for the weights of one routed expert (split across EP ranks)."""
        return self.expert is not None


@dataclass(frozen=True)
class ModelDims:
    """The sizes an adaptor needs, read from an HF config (any object with these attributes)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int = 0
    tie_word_embeddings: bool = False
    q_lora_rank: int | None = None

    @classmethod
    def from_config(cls, config: Any) -> ModelDims:
        """Read the dims from an HF ``PretrainedConfig`` (GPT-2 and Llama naming both work)."""
        num_layers = _first(config, "num_hidden_layers", "n_layer")
        hidden = _first(config, "hidden_size", "n_embd")
        heads = _first(config, "num_attention_heads", "n_head")
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        experts = _first(config, "num_experts", "num_local_experts", "n_routed_experts", default=0)
        return cls(
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            num_experts=experts,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            q_lora_rank=getattr(config, "q_lora_rank", None),
        )

    @property
    def heads_per_group(self) -> int:
        """Query heads per KV group (P)."""
        return self.num_heads // self.num_kv_heads


def _first(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    if default is not None:
        return default
    raise ShapeMismatchError(f"model config has none of {names}")


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


class WeightAdaptor:
    """Converts one model family between the ``hf``, ``train`` and ``infer`` layouts.

    Subclasses declare ``hf_rules`` (hf -> train, with inverses), ``infer_rules``
    (train -> infer, every one with its inverse: ``infer_to_train`` and the ``Resharder``'s
    verification use it) and ``tp_specs`` (train template -> ``(tp_dim, fused_chunks)``) for
    ``self.dims``; everything else is shared.

    Args:
        config: the model's HF config (``PretrainedConfig`` or an object with its attributes).
    """

    architectures: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any) -> None:
        self.config = config
        self.dims = ModelDims.from_config(config)
        self._hf_rules = self.hf_rules()
        self._train_to_hf_rules = [r.inverted() for r in self._hf_rules if r.backward is not None]
        self._infer_rules = self.infer_rules()
        self._infer_to_train_rules = [r.inverted() for r in self._infer_rules]
        specs = self.tp_specs()
        self._spec_patterns = [
            (re.compile(re.escape(t).replace(r"\{\}", r"\d+").replace(r"\{e\}", r"(?P<e>\d+)")), spec)
            for t, spec in specs.items()
        ]

    # -- declarations (subclasses) ---------------------------------------------------------
    def hf_rules(self) -> list[Rule]:
        """Rules from HF names to training names (with ``backward`` for the way back)."""
        raise NotImplementedError

    def infer_rules(self) -> list[Rule]:
        """Rules from training names to inference names, each with ``backward`` (its inverse)."""
        raise NotImplementedError

    def tp_specs(self) -> dict[str, tuple[int | None, int]]:
        """Training template -> ``(tp_dim, fused_chunks)``."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.architectures[0] if self.architectures else type(self).__name__

    # -- conversions -----------------------------------------------------------------------
    def hf_to_train(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF state dict (full tensors) -> training layout."""
        return convert(state, self._hf_rules, f"{self.name} hf -> train")

    def train_to_hf(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Training layout (full tensors) -> HF checkpoint names (per-expert for MoE)."""
        return convert(state, self._train_to_hf_rules, f"{self.name} train -> hf")

    def train_to_infer(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Training layout -> inference layout; tensors may be full or one TP/EP shard."""
        return convert(state, self._infer_rules, f"{self.name} train -> infer")

    def infer_to_train(
        self, state: Mapping[str, torch.Tensor], first_expert: int = 0
    ) -> dict[str, torch.Tensor]:
        """Inference layout -> training layout, the inverse of ``train_to_infer`` (full or sharded).

        Stacked experts come back numbered from ``first_expert``: an EP rank's stack holds the
        contiguous block of experts that starts there.
        """
        return convert(state, self._infer_to_train_rules, f"{self.name} infer -> train", first_expert)

    def hf_to_infer(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF state dict -> inference layout (through the training layout)."""
        return self.train_to_infer(self.hf_to_train(state))

    def infer_groups(self, train_names: Sequence[str]) -> list[list[str]]:
        """Partition training names into the groups that ``train_to_infer`` converts together.

        A stacking rule needs every local expert of a layer at once; all other rules take one
        training name. The ``Resharder`` converts group by group to bound its scratch memory.
        """
        groups: dict[tuple[int, str], list[str]] = {}
        singles: list[list[str]] = []
        for name in train_names:
            for index, rule in enumerate(self._infer_rules):
                found = rule.match(name)
                if found is not None:
                    if rule.stacks:
                        groups.setdefault((index, found.group("layer")), []).append(name)
                    else:
                        singles.append([name])
                    break
            else:
                raise UnknownWeightError(f"{self.name} train -> infer: {name!r} matches no name map entry")
        return singles + list(groups.values())

    def infer_alias(self, train_name: str) -> str | None:
        """The inference name of ``train_name`` when the conversion is a pure rename, else ``None``."""
        for rule in self._infer_rules:
            found = rule.match(train_name)
            if found is not None:
                if not rule.is_rename:
                    return None
                groups = found.groupdict()
                return fill(rule.dst[0], groups.get("layer"), groups.get("e"))
        raise UnknownWeightError(f"{self.name} train -> infer: {train_name!r} matches no name map entry")

    # -- parallelism -----------------------------------------------------------------------
    def param_spec(self, train_name: str) -> ParamSpec:
        """TP dim, fused chunks and expert index of a training-layout parameter."""
        for pattern, (tp_dim, chunks) in self._spec_patterns:
            found = pattern.fullmatch(train_name)
            if found is not None:
                expert = found.groupdict().get("e")
                return ParamSpec(tp_dim, chunks, None if expert is None else int(expert))
        raise UnknownWeightError(f"{self.name}: no parallel spec for training parameter {train_name!r}")

    def stage_of(self, train_name: str, layout: ParallelLayout) -> int:
        """The pipeline stage holding ``train_name`` (embeddings first, head and final norm last)."""
        found = _LAYER.match(train_name)
        if found is not None:
            return stage_of_layer(self.dims.num_layers, layout, int(found.group(1)))
        return 0 if train_name.startswith("embedding.") else layout.pp - 1

    def shard(
        self,
        state: Mapping[str, torch.Tensor],
        layout: ParallelLayout,
        tp_rank: int = 0,
        pp_rank: int = 0,
        ep_rank: int = 0,
        etp_rank: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Cut one rank's training-layout shard out of the full training state.

        Names stay global (layer and expert indices of the full model). Expert weights are
        split over ``layout.ep`` contiguous expert blocks and ``layout.etp`` TP ranks
        (``etp_rank`` defaults to ``tp_rank``).
        """
        etp_rank = tp_rank if etp_rank is None else etp_rank
        for label, value, size in (
            ("tp_rank", tp_rank, layout.tp),
            ("pp_rank", pp_rank, layout.pp),
            ("ep_rank", ep_rank, layout.ep),
            ("etp_rank", etp_rank, layout.etp),
        ):
            if not 0 <= value < size:
                raise LayoutError(f"{label}={value} is outside [0, {size}) for {layout}")
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if self.stage_of(name, layout) != pp_rank:
                continue
            spec = self.param_spec(name)
            if spec.is_expert:
                if self.owner_ep_rank(spec, layout) != ep_rank:
                    continue
                num_shards, index = layout.etp, etp_rank
            else:
                num_shards, index = layout.tp, tp_rank
            if spec.tp_dim is not None:
                tensor = shard_dim(tensor, spec.tp_dim, num_shards, index, spec.fused_chunks).contiguous()
            out[name] = tensor
        return out

    def unshard(
        self,
        shards: Mapping[tuple[int, int], Mapping[str, torch.Tensor]] | Sequence[Mapping[str, torch.Tensor]],
        layout: ParallelLayout,
    ) -> dict[str, torch.Tensor]:
        """The full training state from the shards of every rank: the inverse of ``shard``.

        TP pieces are concatenated along ``tp_dim`` (each fused chunk on its own, so
        ``linear_fc1`` comes back as ``[gate; up]``); replicated parameters are read from TP
        rank 0, and returned as is, like every parameter of a TP = 1 layout (no copy).

        Args:
            shards: ``{(tp_rank, pp_rank): shard}`` with every TP x PP coordinate of a layout
                without expert parallelism, or one shard per global rank in ``layout.coords``
                order (any layout: dense weights are read from DP rank 0, experts from the EP
                rank that owns them).
            layout: the training layout the shards were cut for.

        Raises:
            LayoutError: a rank is missing or out of range, a parameter is absent from a rank
                that holds a piece of it, or sits on another pipeline stage than its own.
        """
        dense, expert, labels = _rank_shards(shards, layout)
        out: dict[str, torch.Tensor] = {}
        for pp_rank in range(layout.pp):
            stage = [s for (_, pp), s in dense.items() if pp == pp_rank]
            stage += [s for (pp, _, _), s in expert.items() if pp == pp_rank]
            for name in dict.fromkeys(n for shard in stage for n in shard):
                owner = self.stage_of(name, layout)
                if owner != pp_rank:
                    raise LayoutError(
                        f"{name!r} is in a shard of pp_rank={pp_rank} but stage {owner} holds it"
                    )
                spec = self.param_spec(name)
                keys: list[tuple[int, ...]]
                if spec.is_expert:
                    ep_rank = self.owner_ep_rank(spec, layout)
                    keys = [(pp_rank, ep_rank, etp_rank) for etp_rank in range(layout.etp)]
                else:
                    keys = [(tp_rank, pp_rank) for tp_rank in range(layout.tp)]
                source = expert if spec.is_expert else dense
                pieces = []
                for key in keys[:1] if spec.tp_dim is None else keys:
                    if name not in source[key]:
                        raise LayoutError(f"{name!r} is missing from the shard of {labels[key]}")
                    pieces.append(source[key][name])
                out[name] = (
                    pieces[0] if spec.tp_dim is None else unshard_dim(pieces, spec.tp_dim, spec.fused_chunks)
                )
        return out

    def owner_ep_rank(self, spec: ParamSpec, layout: ParallelLayout) -> int:
        """The EP rank holding expert ``spec.expert`` (contiguous blocks of ``E / ep`` experts)."""
        if spec.expert is None:
            raise LayoutError("owner_ep_rank needs an expert parameter")
        if self.dims.num_experts % layout.ep:
            raise LayoutError(f"{self.dims.num_experts} experts cannot split over ep={layout.ep}")
        return spec.expert // (self.dims.num_experts // layout.ep)


_Shards = dict[tuple[int, ...], Mapping[str, torch.Tensor]]


def _rank_shards(
    shards: Mapping[tuple[int, int], Mapping[str, torch.Tensor]] | Sequence[Mapping[str, torch.Tensor]],
    layout: ParallelLayout,
) -> tuple[_Shards, _Shards, dict[tuple[int, ...], str]]:
    """``({(tp_rank, pp_rank): shard}, {(pp_rank, ep_rank, etp_rank): shard}, {key: label})``."""
    dense: _Shards = {}
    expert: _Shards = {}
    labels: dict[tuple[int, ...], str] = {}
    if isinstance(shards, Mapping):
        if layout.ep != 1 or layout.etp != layout.tp:
            raise LayoutError(
                f"shards keyed by (tp_rank, pp_rank) cannot describe expert parallelism of {layout}; "
                "pass one shard per rank instead"
            )
        wanted = [(tp_rank, pp_rank) for pp_rank in range(layout.pp) for tp_rank in range(layout.tp)]
        unknown = sorted(set(shards) - set(wanted))
        if unknown:
            raise LayoutError(f"shards for {unknown} are outside the (tp_rank, pp_rank) grid of {layout}")
        for tp_rank, pp_rank in wanted:
            label = f"(tp_rank={tp_rank}, pp_rank={pp_rank})"
            if (tp_rank, pp_rank) not in shards:
                raise LayoutError(f"no shard for {label} of {layout}; got {sorted(shards)}")
            dense[tp_rank, pp_rank] = expert[pp_rank, 0, tp_rank] = shards[tp_rank, pp_rank]
            labels[tp_rank, pp_rank] = labels[pp_rank, 0, tp_rank] = label
        return dense, expert, labels
    layout.validate_world(len(shards))
    for rank, shard in enumerate(shards):
        c = layout.coords(rank, len(shards))
        label = f"rank {rank} (tp_rank={c.tp_rank}, pp_rank={c.pp_rank}, ep_rank={c.ep_rank})"
        for key, by_key in (((c.tp_rank, c.pp_rank), dense), ((c.pp_rank, c.ep_rank, c.etp_rank), expert)):
            if key not in by_key:
                by_key[key] = shard
                labels[key] = label
    return dense, expert, labels
