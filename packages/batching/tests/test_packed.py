"""PackedBatch layout, scatter-back, and a tiny decoder: packed log-probs == padded log-probs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from entrepot.batching import (
    BackendUnavailableError,
    InvalidArgumentError,
    LengthMismatchError,
    PackedBatch,
    _attention,
    packed_causal_attention,
)

VOCAB, DIM, HEADS, KV_HEADS = 37, 32, 4, 2


def _rotary(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary embedding; x [..., S, heads, D], positions [..., S]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs  # [..., S, D/2]
    cos, sin = angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)  # [..., S, 1, D/2]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyDecoder(nn.Module):
    """Two pre-norm blocks (GQA attention with rotary positions, MLP); attention is pluggable."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(DIM),
                    "q": nn.Linear(DIM, DIM),
                    "kv": nn.Linear(DIM, 2 * DIM * KV_HEADS // HEADS),
                    "o": nn.Linear(DIM, DIM),
                    "norm2": nn.LayerNorm(DIM),
                    "mlp": nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, DIM)),
                }
            )
            for _ in range(2)
        )
        self.head = nn.Linear(DIM, VOCAB)

    def _run(
        self, ids: Tensor, positions: Tensor, attend: Callable[[Tensor, Tensor, Tensor], Tensor]
    ) -> Tensor:
        """ids/positions [..., S] -> logits [..., S, V]; attend: q, k, v [..., S, heads, D] -> same."""
        x = self.embed(ids)
        head_dim = DIM // HEADS
        for block in self.blocks:
            h = block["norm1"](x)
            q = block["q"](h).unflatten(-1, (HEADS, head_dim))
            k, v = block["kv"](h).unflatten(-1, (2 * KV_HEADS, head_dim)).chunk(2, dim=-2)
            attn = attend(_rotary(q, positions), _rotary(k, positions), v)
            x = x + block["o"](attn.flatten(-2))
            x = x + block["mlp"](block["norm2"](x))
        return self.head(x)

    def forward_padded(self, ids: Tensor, mask: Tensor) -> Tensor:
        """ids, mask [B, L] (any padding side) -> logits [B, L, V] with a causal key-padding mask."""
        valid = mask.bool()
        positions = (valid.cumsum(-1) - 1).clamp(min=0)
        length = ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = causal & valid[:, None, None, :] | torch.eye(length, dtype=torch.bool)  # [B, 1, L, L]

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, L, D]
            k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2)

        return self._run(ids, positions, attend)

    def forward_packed(self, packed: PackedBatch) -> Tensor:
        """Packed batch -> logits [1, T, V] using packed_causal_attention."""

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            out = packed_causal_attention(q[0], k[0], v[0], packed.cu_seqlens, packed.max_seqlen)
            return out.unsqueeze(0)

        return self._run(packed.input_ids, packed.position_ids, attend)


def _padded_next_token_log_probs(model: TinyDecoder, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """[B, L] log p(next real token) at each real position that has one, and where that holds."""
    logits = model.forward_padded(ids, mask)  # [B, L, V]
    log_probs = logits.log_softmax(-1)
    valid = mask.bool()
    out = torch.zeros(ids.shape, dtype=torch.float32)
    has_next = torch.zeros(ids.shape, dtype=torch.bool)
    for row in range(ids.shape[0]):
        cols = valid[row].nonzero().flatten().tolist()
        for here, nxt in itertools.pairwise(cols):
            out[row, here] = log_probs[row, here, ids[row, nxt]]
            has_next[row, here] = True
    return out, has_next


def _packed_next_token_log_probs(model: TinyDecoder, packed: PackedBatch) -> Tensor:
    logits = model.forward_packed(packed)  # [1, T, V]
    labels = packed.next_token_labels(ignore_index=-100)  # [1, T]
    log_probs = logits.log_softmax(-1)
    gathered = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [1, T]
    return packed.to_padded(gathered.masked_fill(labels == -100, 0.0))  # [B, L]


def _batch(masks: list[list[int]]) -> tuple[Tensor, Tensor]:
    mask = torch.tensor(masks)
    ids = torch.randint(1, VOCAB, mask.shape, generator=torch.Generator().manual_seed(3)) * mask
    return ids, mask


@pytest.mark.parametrize("align_to", [1, 4])
@pytest.mark.parametrize(
    "masks",
    [
        [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]],  # right padded
        [
            [0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 0, 0],
        ],  # prompt left, response right
    ],
)
def test_tiny_decoder_packed_log_probs_equal_padded(masks: list[list[int]], align_to: int) -> None:
    model = TinyDecoder().float().eval()
    ids, mask = _batch(masks)
    with torch.no_grad():
        expected, has_next = _padded_next_token_log_probs(model, ids, mask)
        packed = PackedBatch.from_padded(ids, mask, align_to=align_to)
        got = _packed_next_token_log_probs(model, packed)
    assert has_next.sum() == sum(max(sum(m) - 1, 0) for m in masks)
    torch.testing.assert_close(got[has_next], expected[has_next], atol=1e-5, rtol=0)
    assert torch.all(got[~has_next] == 0)


def test_layout_position_ids_cu_seqlens_and_alignment() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]])
    packed = PackedBatch.from_padded(ids, lengths=[3, 1, 4], align_to=2, pad_value=-1)
    assert packed.input_ids.tolist() == [[5, 6, 7, -1, 8, -1, 1, 2, 3, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2, 3]]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.cu_seqlens.tolist() == [0, 4, 6, 10]
    assert packed.max_seqlen == 4
    assert packed.lengths.tolist() == [3, 1, 4]
    assert packed.next_token_labels().tolist() == [[6, 7, -100, -100, -100, -100, 2, 3, 4, -100]]
    per_token = packed.input_ids.float() * 10
    assert packed.to_padded(per_token).tolist() == [[50, 60, 70, 0], [80, 0, 0, 0], [10, 20, 30, 40]]
    assert [t.tolist() for t in packed.to_list(per_token)] == [[50, 60, 70], [80], [10, 20, 30, 40]]
    labels = packed.pack_padded(ids * 2, pad_value=-7)
    assert labels.tolist() == [[10, 12, 14, -7, 16, -7, 2, 4, 6, 8]]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 7), max_size=6), align_to=st.integers(1, 4))
def test_from_sequences_round_trip(lengths: list[int], align_to: int) -> None:
    seqs = [torch.arange(n) + 100 * i for i, n in enumerate(lengths)]
    packed = PackedBatch.from_sequences(seqs, align_to=align_to)
    assert packed.num_tokens == sum(-(-n // align_to) * align_to for n in lengths)
    assert packed.cu_seqlens.tolist()[-1] == packed.num_tokens
    back = packed.to_list(packed.input_ids)
    assert [t.tolist() for t in back] == [s.tolist() for s in seqs]
    padded = packed.to_padded(packed.input_ids, fill_value=-1)
    for row, seq in zip(padded, seqs, strict=True):
        assert row[: seq.numel()].tolist() == seq.tolist()
        assert torch.all(row[seq.numel() :] == -1)


def test_attention_matches_dense_block_diagonal_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    q = torch.randn(9, 4, 8, generator=gen)
    k, v = torch.randn(2, 9, 2, 8, generator=gen).unbind(0)
    out = packed_causal_attention(q, k, v, cu, max_seqlen=5)
    seg = torch.repeat_interleave(torch.arange(4), (cu[1:] - cu[:-1]).long())
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(9, 9, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(2, 1).transpose(0, 1),
        v.repeat_interleave(2, 1).transpose(0, 1),
        attn_mask=allowed,
    ).transpose(0, 1)
    torch.testing.assert_close(out, ref)
    scaled = packed_causal_attention(q, k, v, cu, 5, softmax_scale=1 / math.sqrt(8), backend="sdpa")
    torch.testing.assert_close(scaled, ref)


def test_flash_backend_refuses_cpu_or_missing_install(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(BackendUnavailableError, match="flash"):
        packed_causal_attention(q, q, q, cu, 4, backend="flash")
    # As if flash-attn were installed: CPU tensors are still refused by name, and auto on CPU float32
    # still takes the portable path (it would fail importing flash_attn here otherwise).
    monkeypatch.setattr(_attention, "flash_attention_available", lambda: True)
    with pytest.raises(BackendUnavailableError, match="needs CUDA fp16/bf16 tensors, got cpu"):
        packed_causal_attention(q, q, q, cu, 4, backend="flash")
    torch.testing.assert_close(
        packed_causal_attention(q, q, q, cu, 4), packed_causal_attention(q, q, q, cu, 4, backend="sdpa")
    )


def test_packed_errors() -> None:
    ids = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(InvalidArgumentError, match="exactly one of attention_mask or lengths"):
        PackedBatch.from_padded(ids)
    with pytest.raises(LengthMismatchError, match="exceeds the padded width"):
        PackedBatch.from_padded(ids, lengths=[4, 1])
    with pytest.raises(InvalidArgumentError, match="align_to must be an int >= 1"):
        PackedBatch.from_padded(ids, lengths=[1, 1], align_to=0)
    packed = PackedBatch.from_padded(ids, lengths=[1, 2])
    with pytest.raises(LengthMismatchError, match=r"expected \[1, 3, ...\]"):
        packed.to_padded(torch.zeros(5))
    with pytest.raises(LengthMismatchError, match="cu_seqlens must start at 0 and end at T=4"):
        packed_causal_attention(
            torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.tensor([0, 3]), 3
        )
