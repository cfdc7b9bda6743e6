"""What every KV-cache rollout engine of ours shares: left padding, prefix dedup, lanes, sampling draws.

`KVCacheDecoder` is the base of the embedded GPT-2 engine (`rollout_embedded`) and the Llama-family
engine (`rollout_llama`). A subclass says how to run tokens through its model (`_forward`), how big
its cache is (`_new_cache`) and how many positions it can place (`max_positions`); this class
samples: prompts left-padded into lock-step rows, each distinct prompt prefilled once and copied to
its GRPO group's rows, rows split over decoding lanes, each step's token drawn by the engine's
`sampler` (`engines.token_sampling`) from randomness drawn before decoding (so lanes do not change
the samples).

Shape legend: B = sequences, S = cached positions, V = vocab, Q = tokens of one forward.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import torch

from entrepot.grpo.embedded.lanes import run_lanes
from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.grpo.engines.token_sampling import GumbelSampler, TokenSampler

__all__ = [
    "NOISE_BYTES",
    "Cache",
    "KVCacheDecoder",
    "NamedTensors",
    "distinct_rows",
    "flat_ids",
    "left_padded",
    "named_items",
    "weight_target",
]

Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), rows first
NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]

# Most bytes of sampling draws made before decoding, so that lanes can split a batch (Gumbel noise for
# the default model's batch is 0.13 MB; at a 50k vocabulary, 256 rows x 512 tokens would be 26 GB).
NOISE_BYTES = 64 * 2**20


def flat_ids(prompts: Sequence[Sequence[int] | torch.Tensor]) -> torch.Tensor:
    """The prompts' token ids end to end, int64 [sum of lengths] (one cat or one tensor, no per-row op)."""
    if any(isinstance(p, torch.Tensor) for p in prompts):
        return torch.cat([torch.as_tensor(p, dtype=torch.long).reshape(-1).cpu() for p in prompts])
    return torch.tensor([token for p in prompts for token in p], dtype=torch.long)


def left_padded(
    flat: torch.Tensor, lengths: list[int], width: int, total: int, pad_token_id: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Prompt ids left-padded to [B, width], and the key mask [B, total], true on their tokens."""
    key_mask = torch.zeros(len(lengths), total, dtype=torch.bool)
    key_mask[:, :width] = torch.arange(width)[None, :] >= (width - torch.tensor(lengths))[:, None]
    ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long)
    ids[key_mask[:, :width]] = flat  # row-major: each row's tokens in order, after its padding
    return ids.to(device), key_mask.to(device)


def distinct_rows(flat: list[int], lengths: list[int]) -> tuple[list[int], list[int]]:
    """The first row of each distinct prompt, and each row's distinct prompt (GRPO repeats each n times).

    `flat` holds the prompts' ids end to end, `lengths` each one's.
    """
    slot: dict[tuple[int, ...], int] = {}
    unique: list[int] = []
    inverse: list[int] = []
    start = 0
    for row, length in enumerate(lengths):
        key = tuple(flat[start : start + length])
        start += length
        if key not in slot:
            slot[key] = len(unique)
            unique.append(row)
        inverse.append(slot[key])
    return unique, inverse


def weight_target(targets: Mapping[str, torch.Tensor], name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The engine tensor `name` is loaded into; a KeyError (unknown name) or ValueError (shape) else."""
    if name not in targets:
        raise KeyError(f"inference weight {name!r} is unknown; expected names like {next(iter(targets))!r}")
    target = targets[name]
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(
            f"inference weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )
    return target


def named_items(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a mapping or of an iterable of pairs."""
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


class KVCacheDecoder:
    """Batched sampling with a KV cache; subclasses supply the model (see the module docstring).

    Attributes a subclass sets: `vocab`, `device`, `lanes` (threads a batch is decoded on, each taking
    a contiguous part of the rows: `entrepot.grpo.embedded.lanes`), `meta` (every weight name it
    needs) and `_loaded` (the names `load_weights` has filled).
    """

    readable_weights = True
    tensor_parallel = 1
    sampler: TokenSampler = GumbelSampler()  # how each step's token is drawn (`engines.token_sampling`)
    vocab: int
    device: torch.device
    lanes: int
    meta: Mapping[str, object]
    _loaded: set[str]

    # -- what a subclass supplies --------------------------------------------------------------

    @property
    def max_positions(self) -> int | None:
        """Positions the model can place (None: no limit)."""
        return None

    def _new_cache(self, rows: int, total: int) -> Cache:
        """An empty cache of `total` positions for `rows` rows."""
        raise NotImplementedError

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: Cache, start: int, key_mask: torch.Tensor
    ) -> torch.Tensor:
        """Run ids [B, Q] (positions [B, Q]) at cache slots [start, start + Q): last logits float32 [B, V]
        (an engine computing in bfloat16 upcasts them: sampling and log-probs are float32)."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------

    def _check_loaded(self) -> None:
        if len(self._loaded) != len(self.meta):
            missing = sorted(set(self.meta) - self._loaded)[:3]
            raise RuntimeError(f"rollout engine has no weights for {missing}...; call load_weights first")

    def _prefill(
        self, flat: list[int], lengths: list[int], ids: torch.Tensor, positions: torch.Tensor,
        key_mask: torch.Tensor, total: int,
    ) -> tuple[torch.Tensor, Cache]:  # fmt: skip
        """Run the prompts ids [B, Lp]: last-position logits [B, V] and the cache of `total` positions.

        Each distinct prompt runs once; its rows copy the result.
        """
        unique, inverse = distinct_rows(flat, lengths)
        cache = self._new_cache(len(unique), total)
        if len(unique) == len(inverse):
            return self._forward(ids, positions, cache, 0, key_mask), cache
        first = torch.tensor(unique, device=ids.device)
        logits = self._forward(ids[first], positions[first], cache, 0, key_mask[first])
        rows = torch.tensor(inverse, device=ids.device)
        return logits[rows], [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        params: SamplingParams,
        *,
        pad_token_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample one response per prompt (a stop token, kept, or the budget ends it), with each sampled
        token's log-prob under the raw logits (before temperature, top-k and top-p: the distribution
        the trainer's log-probs are of).

        Prompts are left-padded so that every row decodes in lock-step; position ids skip padding.
        With `lanes` > 1, contiguous parts of the rows decode on that many threads. The sampler's draws
        are made for the whole batch, time-major, a window of steps at a time (at most `NOISE_BYTES`;
        every step at once for a small vocabulary), and each lane reads its rows' share of it, so the
        samples do not depend on the split; the lanes meet between windows.
        """
        self._check_loaded()
        prompt_len = max(len(p) for p in prompts)
        limit = self.max_positions
        if limit is not None and prompt_len + params.max_new_tokens > limit:
            budget = f"prompt ({prompt_len}) + max_new_tokens ({params.max_new_tokens})"
            raise ValueError(f"{budget} exceeds the model's {limit} positions")
        b, steps = len(prompts), params.max_new_tokens
        lanes = max(1, min(self.lanes, b))
        bounds = list(itertools.pairwise([b * lane // lanes for lane in range(lanes + 1)]))
        decodes = run_lanes(lambda part: _Decode(self, prompts[slice(*part)], params, pad_token_id), bounds)
        window = max(1, NOISE_BYTES // max(1, b * self.sampler.draw_bytes(self.vocab)))
        for t0 in range(0, steps, window):
            t1 = min(steps, t0 + window)
            noise = self.sampler.draw(b, t1 - t0, self.vocab, params, generator)  # [t1 - t0, B, ...]
            noise = None if noise is None else noise.to(self.device)
            shares = [None if noise is None else noise[:, slice(*part)] for part in bounds]
            work = [(d, share, t0, t1) for d, share in zip(decodes, shares, strict=True)]
            run_lanes(lambda job: job[0].advance(*job[1:]), work)
            if all(d.finished for d in decodes):
                break
        decoded = [d.rollout() for d in decodes]
        return Rollout(
            torch.cat([part.tokens for part in decoded]),
            torch.cat([part.lengths for part in decoded]),
            torch.cat([part.logprobs for part in decoded]),
        )


class _Decode:
    """One lane's rows being decoded: prefilled on creation, advanced a window of steps at a time."""

    def __init__(
        self, engine: KVCacheDecoder, prompts: Sequence[Sequence[int] | torch.Tensor], params: SamplingParams,
        pad_token_id: int,
    ) -> None:  # fmt: skip
        b, dev = len(prompts), engine.device
        self.engine, self.params, self.pad = engine, params, pad_token_id
        self.prompt_len = prompt_len = max(len(p) for p in prompts)
        total = prompt_len + params.max_new_tokens
        lengths_in = [len(p) for p in prompts]
        flat = flat_ids(prompts)
        ids, self.key_mask = left_padded(flat, lengths_in, prompt_len, total, pad_token_id, dev)
        positions = (self.key_mask[:, :prompt_len].long().cumsum(-1) - 1).clamp(min=0)  # [B, Lp]
        self.next_pos = self.key_mask[:, :prompt_len].sum(-1)  # [B]
        self.logits, self.cache = engine._prefill(
            flat.tolist(), lengths_in, ids, positions, self.key_mask, total
        )
        self.stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=dev)
        self.done = torch.zeros(b, dtype=torch.bool, device=dev)
        self.out = torch.full((b, params.max_new_tokens), pad_token_id, dtype=torch.long, device=dev)
        self.out_logp = torch.zeros(b, params.max_new_tokens, dtype=torch.float32, device=dev)
        self.lengths = torch.zeros(b, dtype=torch.long, device=dev)
        self.finished = False

    def advance(self, noise: torch.Tensor | None, t0: int, t1: int) -> None:
        """Decode steps [t0, t1); `noise` [t1 - t0, B, ...] is their sampler's draws (None: greedy)."""
        engine, params, last = self.engine, self.params, self.params.max_new_tokens - 1
        for t in range(t0, t1):
            if self.finished:
                return
            draw = None if noise is None else noise[t - t0]
            token = engine.sampler.sample(self.logits, params, draw)  # [B]
            token = torch.where(self.done, torch.full_like(token, self.pad), token)
            self.out[:, t] = token
            self.out_logp[:, t] = self.logits.float().log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            self.lengths += (~self.done).long()
            self.done = self.done | torch.isin(token, self.stop)
            if bool(self.done.all()) or t == last:
                self.finished = True
                return
            self.key_mask[:, self.prompt_len + t] = True
            self.logits = engine._forward(
                token[:, None], self.next_pos[:, None], self.cache, self.prompt_len + t, self.key_mask
            )
            self.next_pos = self.next_pos + 1

    def rollout(self) -> Rollout:
        """The lane's responses: tokens [R], lengths [B], log-probs [R] (on the host)."""
        kept = torch.arange(self.out.shape[1], device=self.out.device)[None, :] < self.lengths[:, None]
        self.cache = []  # the KV cache goes with the call
        return Rollout(self.out[kept].cpu(), self.lengths.cpu(), self.out_logp[kept].cpu())
