"""Prefix sharing for packed passes: the rows of one prompt group attend to a single copy of the prompt.

GRPO samples n responses per prompt, so a packed batch holds every prompt n times. Laid out as
[prompt, response_1, ..., response_n] per group, position ids restarting at the prompt's length for
each response, the per-token layers (embeddings, MLPs, norms, the LM head) run on each prompt token
once, and a masked attention lets response k see the prompt and its own earlier tokens only.
Causality makes every response log-prob the one of the per-row pass (up to float summation order),
and autograd sums the gradients of the shared prompt activations over the group's responses, as
the per-row copies' gradients would add up: the same loss, the same update, fewer tokens.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "SharedPrefixLayout",
    "cached_shared_prefix_layout",
    "segment_starts",
    "shared_prefix_attention",
    "shared_prefix_layout",
]

_RECENT_LAYOUTS = 4  # a step's reference and update passes, over two lanes
_recent: OrderedDict[tuple[bytes, ...], SharedPrefixLayout | None] = OrderedDict()
_recent_lock = threading.Lock()


@dataclass(frozen=True)
class SharedPrefixLayout:
    """Where each token of a batch goes in the shared row, and the attention grid over its groups.

    Attributes:
        order: int64 [M] index into the batch's flat tokens of each shared-row token.
        position_ids: int64 [M] position of each shared-row token inside its own sequence.
        keep: int64 [R] shared-row position predicting each response token, in the batch's order
            (a response's first token is predicted by its group's last prompt token).
        slots: int64 [M] index of each shared-row token in the [G * L] attention grid.
        bias: float32 [G, 1, L, L], added to the attention scores: 0 where query slot q may attend to
            key slot k, -inf elsewhere (SDPA's CPU kernels ran slower with the equal boolean mask
            at the default run's shapes, forward and backward).
    """

    order: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    slots: torch.Tensor
    bias: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.order.numel())


def shared_prefix_layout(
    tokens: torch.Tensor, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor
) -> SharedPrefixLayout | None:
    """The shared layout of rows laid end to end (prompt_i then response_i), or None if no prompt repeats.

    Rows whose prompt tokens are equal form a group, whichever their order in the batch. Each row
    adds one contiguous run of its tokens to the shared row: the first of its group its prompt and
    response, the others their response only.
    """
    prompts, responses = prompt_lengths.to(torch.int64), response_lengths.to(torch.int64)
    if prompts.numel() == 0 or int(prompts.min()) == 0:
        return None  # a row without a prompt token has nothing to predict its first response token from
    starts = segment_starts(prompts + responses)  # [B] each row's first token in `tokens`
    group = _groups(tokens.tolist(), starts.tolist(), prompts.tolist())  # [B]
    num_groups = int(group.max()) + 1
    if num_groups == prompts.numel():
        return None
    rows = torch.sort(group, stable=True).indices  # [B] rows group after group, batch order inside
    first = torch.ones_like(group, dtype=torch.bool)
    first[rows[1:]] = group[rows[1:]] != group[rows[:-1]]  # [B] the first row of its group
    skipped = torch.where(first, 0, prompts)  # [B] leading tokens of the row left out
    run_lengths = prompts + responses - skipped  # [B]
    run_starts = torch.empty_like(run_lengths)  # [B] first shared-row position of each row's run
    run_starts[rows] = segment_starts(run_lengths[rows])
    order, offset = _runs(starts + skipped, run_lengths, rows)  # [M] tokens index, offset in run
    row_of = torch.repeat_interleave(rows, run_lengths[rows])  # [M]
    position = offset + skipped[row_of]  # [M]
    response_start = run_starts + prompts - skipped  # [B] shared-row position of the first response token
    prompt_end = torch.zeros(num_groups, dtype=torch.int64)  # [G] last prompt token of each group
    prompt_end[group[first]] = response_start[first] - 1
    # Response token j of row i is predicted at response_start + j - 1; j = 0 at its group's prompt end.
    keep = torch.repeat_interleave(response_start - 1, responses) + _offsets(responses)  # [R]
    firsts = segment_starts(responses)[responses > 0]
    keep[firsts] = prompt_end[group[responses > 0]]
    # Segment per token: 0 on its group's prompt, else 1 + the row's place in the group.
    rank = (
        torch.arange(prompts.numel())
        - segment_starts(torch.bincount(group, minlength=num_groups))[group[rows]]
    )
    place = torch.empty_like(rank)
    place[rows] = rank
    segment = torch.where(position < prompts[row_of], 0, 1 + place[row_of])  # [M]
    group_lengths = torch.bincount(group, weights=run_lengths.double(), minlength=num_groups).long()  # [G]
    return _layout(order, position, keep, segment, group_lengths)


def cached_shared_prefix_layout(
    tokens: torch.Tensor, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor
) -> SharedPrefixLayout | None:
    """`shared_prefix_layout`, remembered for the last few batches (keyed by their contents).

    A step's reference pass and update lay out the same rows.
    """
    key = tuple(t.detach().cpu().numpy().tobytes() for t in (tokens, prompt_lengths, response_lengths))
    with _recent_lock:
        if key in _recent:
            _recent.move_to_end(key)
            return _recent[key]
    layout = shared_prefix_layout(tokens, prompt_lengths, response_lengths)
    with _recent_lock:
        _recent[key] = layout
        while len(_recent) > _RECENT_LAYOUTS:
            _recent.popitem(last=False)
    return layout


def segment_starts(lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum: where each segment starts in the flat tensor. [B] -> [B]."""
    return torch.cumsum(lengths, 0) - lengths


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    """[sum(lengths)]: 0 .. length - 1 for each run, runs after each other."""
    total = int(lengths.sum())
    return torch.arange(total) - torch.repeat_interleave(segment_starts(lengths), lengths, output_size=total)


def _runs(
    begins: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexes [M] of the runs [begins_i, begins_i + lengths_i) taken in `rows` order, and offsets in them."""
    ordered = lengths[rows]
    offset = _offsets(ordered)
    return torch.repeat_interleave(begins[rows], ordered, output_size=offset.numel()) + offset, offset


def _groups(flat: list[int], starts: list[int], prompts: list[int]) -> torch.Tensor:
    """int64 [B] group id of each row, numbered by first appearance; equal prompt tokens, equal id."""
    ids: dict[tuple[int, ...], int] = {}
    return torch.tensor(
        [ids.setdefault(tuple(flat[s : s + p]), len(ids)) for s, p in zip(starts, prompts, strict=True)],
        dtype=torch.int64,
    )


def _layout(
    order: torch.Tensor, position: torch.Tensor, keep: torch.Tensor, segment: torch.Tensor,
    group_lengths: torch.Tensor,
) -> SharedPrefixLayout:  # fmt: skip
    """The layout's tensors, and the [G, 1, L, L] additive mask of its attention grid."""
    num_groups, width = group_lengths.numel(), int(group_lengths.max())
    slots = torch.repeat_interleave(torch.arange(num_groups) * width, group_lengths) + _offsets(group_lengths)
    grid = torch.full((num_groups * width,), -1, dtype=torch.int64)  # pad slots: -1
    grid[slots] = segment
    grid = grid.view(num_groups, width)
    # A query sees earlier keys of its own segment or of its group's prompt (segment 0); a pad query
    # sees at least itself, so no softmax row is empty.
    same = (grid[:, None, :] == grid[:, :, None]) | (grid[:, None, :] == 0)  # [G, L_q, L_k]
    allowed = same & torch.ones(width, width, dtype=torch.bool).tril()
    bias = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, float("-inf"))
    return SharedPrefixLayout(order=order, position_ids=position, keep=keep, slots=slots, bias=bias[:, None])


def shared_prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SharedPrefixLayout, scale: float | None
) -> torch.Tensor:
    """Attention over the shared row: q [M, H, D], k / v [M, H_kv, D] -> [M, H, D].

    Tokens are scattered into the [G, L] grid of their groups, one masked SDPA call runs, and the
    real tokens are gathered back. Differentiable in q, k and v.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # grouped-query attention: each key head serves `groups` query heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    num_groups, width = layout.bias.shape[0], layout.bias.shape[-1]

    def to_grid(t: torch.Tensor) -> torch.Tensor:  # [M, H, D] -> [G, H, L, D]
        grid = t.new_zeros((num_groups * width, *t.shape[1:])).index_copy_(0, layout.slots.to(t.device), t)
        return grid.view(num_groups, width, *t.shape[1:]).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        to_grid(q), to_grid(k), to_grid(v), attn_mask=layout.bias.to(q.device, q.dtype), scale=scale
    )  # [G, H, L, D]
    flat = out.transpose(1, 2).reshape(num_groups * width, *q.shape[1:])  # [G * L, H, D]
    return flat.index_select(0, layout.slots.to(q.device))
