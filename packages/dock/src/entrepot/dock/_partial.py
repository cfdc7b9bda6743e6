"""Partial rollout in the dock: which rows downstream consumers may get, and the staleness budget.

With a rollout consumer, a row whose response is unfinished (put with ``completed=False``) stays with
the rollout; downstream consumers get only the rows of *finished groups* (every row completed), since
GRPO scores and trains whole groups. A downstream consumer is done for the iteration once the rollout
holds nothing in flight (it has taken every row and holds no lease: the rollout gets under a lease and
acks with its put when downstream stages run beside it) and it has every row of the finished groups.

Policy versions: the dock knows the version of the policy that generates from now on
(`set_policy_version`) and records, per row, the version its response began under (``born``, at the
row's first put with ``completed=``). When the version advances, groups holding a row born more than
`max_staleness` versions ago are dropped, so no consumer ever gets them.

Legend: R rows (capacity), n rows per group.
"""

from __future__ import annotations

import torch


def finished_groups(live: torch.Tensor, completed: torch.Tensor, n: int) -> torch.Tensor:
    """bool [R]: live rows whose group holds no unfinished row."""
    unfinished = (live & ~completed).view(-1, n).any(1)
    return live & ~unfinished.repeat_interleave(n)


def stale_groups(
    live: torch.Tensor, born: torch.Tensor, version: int, max_staleness: int, n: int
) -> torch.Tensor:
    """bool [R]: live rows of groups holding a row born over `max_staleness` versions before `version`."""
    stale = live & (born >= 0) & (version - born > max_staleness)
    return stale.view(-1, n).any(1).repeat_interleave(n) & live
