"""Declarative name maps: a ``Rule`` turns the tensors of some source names into target names.

Templates use ``{}`` for the decoder layer index and ``{e}`` for the expert index, e.g.
``"model.layers.{}.mlp.experts.{e}.gate_proj.weight"``. A rule whose sources carry ``{e}`` but
whose targets do not *stacks* experts (its function gets one list per source template, in
expert order); the other way round it *unstacks* (its function returns one list per target).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.resharding.errors import UnknownWeightError

__all__ = ["Rule", "convert", "fill", "rename"]

Fn = Callable[..., Any]


@dataclass(frozen=True)
class Rule:
    """Source templates -> target templates through ``forward``; ``backward`` inverts it.

    ``forward`` takes one tensor per source template and returns a tuple with one tensor per
    target template (lists of tensors for stacking / unstacking rules, see the module doc).
    A rule without ``backward`` works in one direction only.
    """

    src: tuple[str, ...]
    dst: tuple[str, ...]
    forward: Fn
    backward: Fn | None = None
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_patterns", tuple(_compile(t) for t in self.src))

    @property
    def stacks(self) -> bool:
        return "{e}" in self.src[0] and not any("{e}" in t for t in self.dst)

    @property
    def unstacks(self) -> bool:
        return bool(self.dst) and "{e}" in self.dst[0] and "{e}" not in self.src[0]

    def match(self, name: str) -> re.Match[str] | None:
        """The match of ``name`` against one of the source templates, if any."""
        return next((found for p in self._patterns if (found := p.fullmatch(name)) is not None), None)

    @property
    def is_rename(self) -> bool:
        """True when the rule only renames one tensor (its data can be written in place)."""
        return self.forward is _identity and len(self.src) == 1 and len(self.dst) == 1

    def inverted(self) -> Rule:
        """The rule from ``dst`` to ``src`` (requires ``backward``)."""
        if self.backward is None:
            raise ValueError(f"rule {self.src} -> {self.dst} has no backward function")
        return Rule(self.dst, self.src, self.backward, self.forward)


def _identity(tensor: torch.Tensor) -> tuple[torch.Tensor]:
    return (tensor,)


def rename(src: str, dst: str) -> Rule:
    """A one-to-one rule that only changes the name."""
    return Rule((src,), (dst,), _identity, _identity)


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{\}", r"(?P<layer>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
    return re.compile(pattern)


def fill(template: str, layer: str | None, expert: int | str | None) -> str:
    name = template if layer is None else template.replace("{}", layer)
    return name if expert is None else name.replace("{e}", str(expert))


def convert(
    state: Mapping[str, torch.Tensor], rules: Sequence[Rule], what: str, first_expert: int = 0
) -> dict[str, torch.Tensor]:
    """Apply ``rules`` to every tensor of ``state``; a name no rule matches is an error.

    Args:
        state: ``{name: tensor}`` in the source layout (full or TP-sharded tensors).
        rules: the rules of one direction; each source name must match exactly one template.
        what: the direction, for error messages (e.g. ``"Qwen2ForCausalLM hf -> train"``).
        first_expert: the expert index an unstacking rule gives its first tensor (an EP rank's
            stack holds experts ``first_expert, first_expert + 1, ...``).
    """
    # (rule index, layer, expert or None) -> {source slot: {expert or None: tensor}}
    groups: dict[tuple[int, str | None, str | None], dict[int, dict[int | None, torch.Tensor]]] = {}
    for name, tensor in state.items():
        found = _match(name, rules)
        if found is None:
            raise UnknownWeightError(f"{what}: {name!r} matches no name map entry")
        index, slot, layer, expert = found
        rule = rules[index]
        key_expert = None if rule.stacks or expert is None else str(expert)
        slots = groups.setdefault((index, layer, key_expert), {})
        slots.setdefault(slot, {})[expert] = tensor
    out: dict[str, torch.Tensor] = {}
    for (index, layer, key_expert), slots in groups.items():
        rule = rules[index]
        missing = [fill(t, layer, key_expert or "{e}") for i, t in enumerate(rule.src) if i not in slots]
        if missing:
            raise UnknownWeightError(
                f"{what}: missing {missing} needed together with {fill(rule.src[0], layer, key_expert)!r}"
            )
        if rule.stacks:
            experts = sorted(e for e in slots[0] if e is not None)
            if any(sorted(e for e in s if e is not None) != experts for s in slots.values()):
                raise UnknownWeightError(
                    f"{what}: templates {rule.src} of layer {layer} hold different experts"
                )
            results = rule.forward(*([slots[i][e] for e in experts] for i in range(len(rule.src))))
        else:
            results = rule.forward(*(next(iter(slots[i].values())) for i in range(len(rule.src))))
        for template, result in zip(rule.dst, results, strict=True):
            if rule.unstacks:
                for expert_index, tensor in enumerate(result):
                    out[fill(template, layer, first_expert + expert_index)] = tensor
            else:
                out[fill(template, layer, key_expert)] = result
    return out


def _match(name: str, rules: Sequence[Rule]) -> tuple[int, int, str | None, int | None] | None:
    for index, rule in enumerate(rules):
        for slot, pattern in enumerate(rule._patterns):
            found = pattern.fullmatch(name)
            if found is not None:
                groups = found.groupdict()
                expert = groups.get("e")
                return index, slot, groups.get("layer"), None if expert is None else int(expert)
    return None
