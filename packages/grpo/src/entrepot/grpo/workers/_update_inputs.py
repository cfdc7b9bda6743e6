"""What one actor rank trains on: the update's columns and its `UpdateInputs`, from the dock rows it took."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from entrepot.dock import Batch
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.shaping import truncated_rows
from entrepot.grpo.algo.update import UpdateInputs
from entrepot.grpo.config import AlgorithmConfig, CorrectionConfig
from entrepot.grpo.config.correction import resolve as resolve_correction
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS

__all__ = ["TOKEN_ADVANTAGES", "UpdateColumns", "response_batch", "update_columns", "update_inputs"]

TOKEN_ADVANTAGES = "token_advantages"
"""Flat per row, one advantage per response token (distillation); without it `advantages` (one per
response) is broadcast over the response's tokens."""

_OLD_BEHAVIOUR = "rollout_log_prob"
"""With partial rollout the importance ratio divides by each token's behaviour log-prob: the policy
version that sampled it, which for a response spanning rounds is not the policy the update starts from."""


def response_batch(batch: Batch) -> ResponseBatch:
    """The prompt+response rows of a packed dock batch."""
    data = batch.columns
    return ResponseBatch.from_packed(
        data["prompts"], batch.lengths["prompts"], data["responses"], data["response_length"]
    )


@dataclass(frozen=True)
class UpdateColumns:
    """What the update reads from the dock.

    Attributes:
        columns: the dock columns.
        use_ref: the loss has a KL term (reference log-probs).
        old: the ratio's old log-probs' column (None: the current ones, detached).
        behaviour: the rollout's log-probs' column for the off-policy correction (None: no correction).
        correction: the resolved `algorithm.correction`.
        model_mask: multi-turn rows: the loss reads which tokens the model sampled.
        token_advantages: the advantages are per token (`TOKEN_ADVANTAGES`: distillation).
    """

    columns: list[str]
    use_ref: bool
    old: str | None
    behaviour: str | None
    correction: CorrectionConfig
    model_mask: bool = False
    token_advantages: bool = False


def update_columns(
    algorithm: AlgorithmConfig, *, with_old: bool, behaviour: bool, asynchronous: bool,
    rollout_logprobs: bool, multiturn: bool = False,
) -> UpdateColumns:  # fmt: skip
    """The columns of the update.

    The ratio's old log-probs come from the old-log-prob stage (`with_old`), else from the behaviour
    log-probs (`behaviour`: partial rollout, asynchronous training) unless a correction weighs them,
    else nowhere (the current ones, detached: one optimiser step). The off-policy
    correction (`algorithm.correction`, resolved for the mode) reads the rollout's log-probs, which
    the dock holds with `behaviour` or `rollout_logprobs` (an engine of its own kernels, or the
    correction asked for in synchronous training).
    """
    use_ref = algorithm.kl_coef > 0 and not algorithm.kl_in_reward
    correction = resolve_correction(algorithm.correction, asynchronous)
    corrected = correction.active and (behaviour or rollout_logprobs)
    # a corrected update of one optimiser step needs no old-log-prob pass: the proximal log-probs are
    # the current ones, detached, and the correction weighs them against the rollout's
    old = "old_log_prob" if with_old else None if corrected else _OLD_BEHAVIOUR if behaviour else None
    columns = [*SEQUENCE_COLUMNS, "advantages", *(["ref_log_prob"] if use_ref else [])]
    columns += [old] if old else []
    columns += [_OLD_BEHAVIOUR] if corrected and old != _OLD_BEHAVIOUR else []
    columns += ["model_mask"] if multiturn else []
    per_token = algorithm.distill.enabled
    columns += [TOKEN_ADVANTAGES] if per_token else []
    return UpdateColumns(columns, use_ref, old, _OLD_BEHAVIOUR if corrected else None, correction, multiturn,
                         per_token)  # fmt: skip


def update_inputs(
    got: Batch | None, plan: Sequence[Sequence[int]], columns: UpdateColumns,
    algorithm: AlgorithmConfig, sampling: SamplingParams, horizon: int | None = None,
) -> UpdateInputs:  # fmt: skip
    """This rank's `UpdateInputs` from the rows it took (`got`; None: it holds no row of this step, a
    short dynamic-sampling step), split into the mini-batches of `plan`. `horizon`: the token budget
    of a response when it is not `sampling`'s (a multi-turn trajectory's)."""
    use_ref, old = columns.use_ref, columns.old
    sizes = [len(mini) for mini in plan]
    local = torch.split(torch.arange(sum(sizes)), sizes)
    if got is None:
        empty = torch.zeros(0, dtype=torch.int64)
        return UpdateInputs(ResponseBatch(empty, empty, empty), torch.zeros(0),
                            None if old is None else torch.zeros(0), torch.zeros(0) if use_ref else None,
                            local)  # fmt: skip
    data, batch = got.columns, response_batch(got)
    return UpdateInputs(
        batch=batch,
        advantages=data["advantages"].float(),
        old_logp=None if old is None else data[old].float(),
        ref_logp=data["ref_log_prob"] if use_ref else None,
        mini_batches=local,
        horizon=algorithm.loss_horizon or horizon or sampling.max_new_tokens,
        keep=~truncated_rows(batch, sampling.max_new_tokens, sampling.stop_token_ids)
        if algorithm.mask_truncated else None,
        behaviour_logp=None if columns.behaviour is None else data[columns.behaviour].float(),
        correction=columns.correction,
        model_mask=data["model_mask"].bool() if columns.model_mask else None,
        token_advantages=data[TOKEN_ADVANTAGES].float() if columns.token_advantages else None,
    )  # fmt: skip
