"""Micro-batching of the forward/backward passes: the `batching` section.

That each token budget holds the longest prompt + response is checked with the task's token
lengths, before a run starts, by `entrepot.grpo.data.checks.check_token_budgets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["BatchingConfig", "PassBatchingConfig"]


@dataclass(kw_only=True)
class PassBatchingConfig:
    """Micro-batch caps of one forward/backward pass; null takes the batching section's value."""

    max_tokens: int | None = field(
        default=None,
        metadata=doc(
            "Token budget of a micro-batch of this pass; null = batching.max_tokens_per_micro_batch."
        ),
    )
    max_seqs: int | None = field(
        default=None,
        metadata=doc(
            "Most sequences in a micro-batch of this pass; null = batching.max_seqs_per_micro_batch."
        ),
    )

    def check(self, prefix: str) -> None:
        for name in ("max_tokens", "max_seqs"):
            value = getattr(self, name)
            if value is not None:
                check(value >= 1, f"{prefix}.{name}", value, ">= 1 or null")


@dataclass(kw_only=True)
class BatchingConfig:
    """Micro-batching of the forward/backward passes (entrepot.batching)."""

    remove_padding: bool = field(
        default=True,
        metadata=doc(
            "Run log-probs and the update on packed sequences (one row, cu_seqlens, varlen attention) "
            "instead of a padded grid: no compute on pad tokens."
        ),
    )
    dynamic_batch_size: bool = field(
        default=True, metadata=doc("Form micro-batches under a token budget (else micro_batch_size rows).")
    )
    max_tokens_per_micro_batch: int = field(
        default=8192,
        metadata=doc("Token budget of a micro-batch (dynamic batch size); >= the longest prompt + response."),
    )
    max_seqs_per_micro_batch: int | None = field(
        default=None, metadata=doc("Most sequences in a dynamic micro-batch; null = no cap.")
    )
    micro_batch_size: int = field(
        default=64, metadata=doc("Responses per micro-batch when dynamic_batch_size is off.")
    )
    ref_log_prob: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=doc("Caps of the reference log-prob pass.")
    )
    old_log_prob: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=doc("Caps of the old (sampling policy) log-prob pass.")
    )
    update: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=doc("Caps of the actor update (forward + backward).")
    )
    dp_balance: bool = field(
        default=True, metadata=doc("Balance tokens across DP ranks (Karmarkar-Karp) when DP > 1.")
    )

    def __post_init__(self) -> None:
        check(
            self.max_tokens_per_micro_batch >= 1,
            "batching.max_tokens_per_micro_batch",
            self.max_tokens_per_micro_batch,
            ">= 1",
        )
        if self.max_seqs_per_micro_batch is not None:
            check(
                self.max_seqs_per_micro_batch >= 1,
                "batching.max_seqs_per_micro_batch",
                self.max_seqs_per_micro_batch,
                ">= 1 or null",
            )
        check(self.micro_batch_size >= 1, "batching.micro_batch_size", self.micro_batch_size, ">= 1")
        for name in ("ref_log_prob", "old_log_prob", "update"):
            getattr(self, name).check(f"batching.{name}")

    def limits(self, name: str) -> tuple[int, int | None]:
        """(token budget, sequence cap) of pass `name` (ref_log_prob, old_log_prob or update)."""
        caps: PassBatchingConfig = getattr(self, name)
        tokens = caps.max_tokens if caps.max_tokens is not None else self.max_tokens_per_micro_batch
        seqs = caps.max_seqs if caps.max_seqs is not None else self.max_seqs_per_micro_batch
        return tokens, seqs
