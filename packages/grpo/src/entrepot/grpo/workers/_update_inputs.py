"""What one actor rank trains on: the update's columns and its `UpdateInputs`, from the dock rows it took."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from entrepot.dock import Batch
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.shaping import truncated_rows
from entrepot.grpo.algo.update import UpdateInputs
from entrepot.grpo.config import AlgorithmConfig, RolloutConfig
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS

__all__ = ["UpdateColumns", "response_batch", "update_columns", "update_inputs"]

_OLD_BEHAVIOUR = "rollout_log_prob"
"""With partial rollout the importance ratio divides by each token's behaviour log-prob: the policy
version that sampled it, which for a response spanning rounds is not the policy the update starts from."""


def response_batch(batch: Batch) -> ResponseBatch:
    """The prompt+response rows of a packed dock batch."""
    data = batch.columns
    return ResponseBatch.from_packed(
        data["prompts"], batch.lengths["prompts"], data["responses"], data["response_length"]
    )


UpdateColumns = tuple[list[str], bool, str | None]
"""(dock columns the update reads, whether the loss has a KL term, the old log-probs' column)."""


def update_columns(algorithm: AlgorithmConfig, rollout: RolloutConfig, with_old: bool) -> UpdateColumns:
    """The columns of the update; the ratio's old log-probs come from the behaviour log-probs (partial
    rollout), the old-log-prob stage (`with_old`), or nowhere (None: the current ones, detached)."""
    use_ref = algorithm.kl_coef > 0 and not algorithm.kl_in_reward
    old = _OLD_BEHAVIOUR if rollout.partial_max_tokens is not None else "old_log_prob" if with_old else None
    columns = [*SEQUENCE_COLUMNS, "advantages", *(["ref_log_prob"] if use_ref else [])]
    columns += [old] if old else []
    return columns, use_ref, old


def update_inputs(
    got: Batch | None, plan: Sequence[Sequence[int]], columns: UpdateColumns,
    algorithm: AlgorithmConfig, sampling: SamplingParams,
) -> UpdateInputs:  # fmt: skip
    """This rank's `UpdateInputs` from the rows it took (`got`; None: it holds no row of this step, a
    short dynamic-sampling step), split into the mini-batches of `plan`."""
    _, use_ref, old = columns
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
        horizon=algorithm.loss_horizon or sampling.max_new_tokens,
        keep=~truncated_rows(batch, sampling.max_new_tokens, sampling.stop_token_ids)
        if algorithm.mask_truncated else None,
    )  # fmt: skip
