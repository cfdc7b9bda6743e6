"""One round of partial rollout over a batch of dock rows (`rollout.partial_max_tokens`).

A round gives each response at most `partial_max_tokens` new tokens; a response that neither stops nor
reaches `max_new_tokens` stays unfinished in the dock and continues next step, under the weights of
that step, from its prompt plus what it has so far. A response that has survived `max_age - 1` rounds
is forced: this round runs it to its stop token or its budget. Every token keeps the log-prob it was
sampled with (the behaviour log-prob of the loss's importance ratio) and the policy version that
sampled it.

Rows of one round with the same response length so far share a budget (an unfinished response has
used exactly `age x partial_max_tokens` tokens), so each such class is one engine call whose prompt
plus budget fits the model's positions whenever a whole response does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from entrepot.grpo.engines.base import RolloutEngine, SamplingParams

__all__ = ["RoundOutput", "partial_round"]


@dataclass
class RoundOutput:
    """The dock columns of a round's rows and what the round did.

    Attributes:
        columns: responses / response_length / rollout_log_prob / policy_version, whole responses so far.
        completed: bool [B] which responses finished (stop token, budget, or forced).
        new_tokens: tokens generated this round.
        continued: rows that continued a response begun in an earlier round.
        forced: forced rows that needed more than `partial_max_tokens` tokens to finish.
    """

    columns: dict[str, Any]
    completed: torch.Tensor
    new_tokens: int
    continued: int
    forced: int


def partial_round(
    engine: RolloutEngine,
    prompts: list[torch.Tensor],
    ages: torch.Tensor,
    previous: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    sampling: SamplingParams,
    *,
    partial_max_tokens: int,
    max_age: int,
    version: int,
    pad_token_id: int,
    generator: torch.Generator,
) -> RoundOutput:
    """Generate one round for B rows.

    Args:
        engine: the rollout engine.
        prompts: B prompt token tensors.
        ages: int [B] rounds each row has survived unfinished (0: a new row).
        previous: per row, (tokens, log-probs, versions) of its response so far (empty for new rows).
        sampling: the run's sampling parameters; `max_new_tokens` is a whole response's budget.
        partial_max_tokens, max_age: see the module docstring.
        version: the policy version generating now.
    """
    budget, stops = sampling.max_new_tokens, set(sampling.stop_token_ids)
    forced_rows = (ages >= max_age - 1).tolist()
    classes: dict[tuple[int, bool], list[int]] = {}
    for row, (tokens, _, _) in enumerate(previous):
        classes.setdefault((int(tokens.numel()), bool(forced_rows[row])), []).append(row)
    nothing = (torch.zeros(0, dtype=torch.long), torch.zeros(0))
    new: list[tuple[torch.Tensor, torch.Tensor]] = [nothing] * len(prompts)
    for (done, forced), rows in sorted(classes.items()):
        left = budget - done
        params = dataclasses.replace(
            sampling, max_new_tokens=left if forced else min(partial_max_tokens, left)
        )
        inputs = [torch.cat([prompts[r], previous[r][0].to(prompts[r].dtype)]) for r in rows]
        out = engine.generate(inputs, params, pad_token_id=pad_token_id, generator=generator)
        for r, t, lp in zip(rows, out.responses(), out.response_logprobs(), strict=True):
            new[r] = (t, lp)
    responses, logps, versions, completed = [], [], [], []
    forced_count = 0
    for row, ((old_t, old_lp, old_v), (t, lp)) in enumerate(zip(previous, new, strict=True)):
        responses.append(torch.cat([old_t.long(), t.long()]))
        logps.append(torch.cat([old_lp.float(), lp.float()]))
        versions.append(torch.cat([old_v.int(), torch.full((len(t),), version, dtype=torch.int32)]))
        ended = t.numel() > 0 and int(t[-1]) in stops
        completed.append(ended or responses[-1].numel() >= budget or forced_rows[row])
        forced_count += int(forced_rows[row] and len(t) > partial_max_tokens)
    lengths = torch.tensor([r.numel() for r in responses], dtype=torch.int64)
    columns: dict[str, Any] = {
        "responses": (torch.cat(responses), lengths),
        "response_length": lengths,
        "rollout_log_prob": (torch.cat(logps), lengths),
        "policy_version": (torch.cat(versions), lengths),
    }
    return RoundOutput(
        columns=columns,
        completed=torch.tensor(completed, dtype=torch.bool),
        new_tokens=sum(len(t) for t, _ in new),
        continued=int((ages > 0).sum()),
        forced=forced_count,
    )
