"""Off-policy correction of the train / inference mismatch: the `algorithm.correction` section.

The rollout engine samples each token with log-prob b_t (its kernels, its precision, and in
asynchronous training possibly an older policy version); the trainer recomputes the proximal
log-prob o_t of the same token at the start of the update. The correction reweights (or masks) each
token's surrogate loss by the importance ratio rho = exp(o - b); the formulas are in
`entrepot.grpo.algo.correction`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = ["CorrectionConfig", "CorrectionKind", "CorrectionLevel", "resolve"]

CorrectionKind = Literal["none", "tis", "mis", "icepop"]
CorrectionLevel = Literal["token", "sequence"]


@dataclass(kw_only=True)
class CorrectionConfig:
    """Importance weight or mask on each token's surrogate loss from the rollout's own log-probs."""

    kind: CorrectionKind | None = field(
        default=None,
        metadata=doc(
            "none | tis (truncated IS: weight min(rho, cap)) | mis (masked IS: weight 1 inside "
            "[low, high], else 0) | icepop (weight rho inside [low, high], else 0; token level only). "
            "rho = exp(trainer log-prob - rollout log-prob). null = automatic: none in synchronous "
            "training, tis at token level in asynchronous training."
        ),
    )
    level: CorrectionLevel = field(
        default="token",
        metadata=doc(
            "token: each token's own rho; sequence: the product of a response's token ratios, applied "
            "to (or dropping) the whole response."
        ),
    )
    cap: float = field(default=2.0, metadata=doc("tis: the largest weight (>= 1)."))
    low: float = field(default=0.5, metadata=doc("mis / icepop: smallest rho kept, in (0, 1]."))
    high: float = field(default=2.0, metadata=doc("mis / icepop: largest rho kept (>= 1)."))

    def __post_init__(self) -> None:
        if self.kind is not None:
            check_choice("algorithm.correction.kind", self.kind, typing.get_args(CorrectionKind))
        check_choice("algorithm.correction.level", self.level, typing.get_args(CorrectionLevel))
        check(self.cap >= 1, "algorithm.correction.cap", self.cap, ">= 1")
        check(0 < self.low <= 1, "algorithm.correction.low", self.low, "in (0, 1]")
        check(self.high >= 1, "algorithm.correction.high", self.high, ">= 1")
        check(
            not (self.kind == "icepop" and self.level == "sequence"),
            "algorithm.correction.level",
            self.level,
            "'token' with algorithm.correction.kind 'icepop' (IcePop masks tokens)",
        )

    @property
    def active(self) -> bool:
        """Whether a concrete correction other than none is chosen (`resolve` first for None)."""
        return self.kind is not None and self.kind != "none"


def resolve(correction: CorrectionConfig, asynchronous: bool) -> CorrectionConfig:
    """`correction` with a concrete kind: an explicit choice is kept; None (automatic) becomes
    none in synchronous training and tis at token level (with `cap`, default 2.0) in asynchronous
    training, where tokens of one response may come from several policy versions."""
    if correction.kind is not None:
        return correction
    if asynchronous:
        return dataclasses.replace(correction, kind="tis", level="token")
    return dataclasses.replace(correction, kind="none")
