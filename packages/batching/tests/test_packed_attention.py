"""The portable packed attention (one SDPA call) against the former per-sequence loop."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from entrepot.batching import BackendUnavailableError, LengthMismatchError, packed_causal_attention
from entrepot.batching import _attention as attention
from entrepot.batching._attention import (
    _block_size,
    _prefer_padded_rows,
    _sdpa_per_sequence,
    packed_attention_kernel,
)

HEAD_DIM = 16
LAYOUTS = ["rows", "windowed"]


def _long_tail(num: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(16, 512) for _ in range(num)]


CASES: dict[str, list[int]] = {
    "equal": [32] * 8,
    "long-tail": _long_tail(10, seed=0),
    "ones": [1] * 9,
    "single": [300],
    "longer-than-any-block": [700, 3, 290],  # L - 1 > 256 = the largest block size
    "with-empties": [0, 5, 0, 2, 0],
}


def _cu(lengths: list[int]) -> Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _qkv(num_tokens: int, heads: int = 4, kv_heads: int = 4, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, heads, HEAD_DIM, generator=gen)  # [T, H, D]
    k, v = torch.randn(2, num_tokens, kv_heads, HEAD_DIM, generator=gen).unbind(0)  # [T, H_kv, D]
    return q, k, v


@pytest.fixture
def force_layout(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Pin the layout the cost estimate would pick ("rows" or "windowed")."""

    def force(layout: str) -> None:
        monkeypatch.setattr(attention, "_prefer_padded_rows", lambda *_: layout == "rows")

    return force


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts scaled_dot_product_attention calls made through the attention module."""
    calls: list[int] = []
    real = F.scaled_dot_product_attention

    def counting(*args: object, **kwargs: object) -> Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    yield calls


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_per_sequence_loop(case: str, layout: str, force_layout: Callable[[str], None]) -> None:
    lengths = CASES[case]
    q, k, v = _qkv(sum(lengths))
    force_layout(layout)
    out = packed_causal_attention(q, k, v, _cu(lengths), max(lengths), backend="sdpa")
    ref = _sdpa_per_sequence(q, k, v, _cu(lengths), None)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_grouped_query_attention_and_scale(layout: str, force_layout: Callable[[str], None]) -> None:
    lengths = [40, 1, 290, 7]
    q, k, v = _qkv(sum(lengths), heads=8, kv_heads=2)
    force_layout(layout)
    out = packed_causal_attention(q, k, v, _cu(lengths), 290, softmax_scale=0.3, backend="sdpa")
    ref = _sdpa_per_sequence(q, k, v, _cu(lengths), 0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("lengths", "kv_heads"), [(CASES["long-tail"], 4), ([33, 1, 20, 300], 2)])
def test_gradients_match_per_sequence_loop(
    lengths: list[int], kv_heads: int, layout: str, force_layout: Callable[[str], None]
) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(sum(lengths), kv_heads=kv_heads))
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))  # [T, H, D]
    force_layout(layout)
    packed_causal_attention(q, k, v, _cu(lengths), max(lengths)).backward(grad_out)
    got = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _sdpa_per_sequence(q, k, v, _cu(lengths), None).backward(grad_out)
    for grad, t in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(grad, t.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_on_cpu(layout: str, force_layout: Callable[[str], None]) -> None:
    lengths = [100, 3, 260, 1]
    q, k, v = _qkv(sum(lengths), heads=4, kv_heads=2)
    q16, k16, v16 = (t.bfloat16().requires_grad_() for t in (q, k, v))
    force_layout(layout)
    out = packed_causal_attention(q16, k16, v16, _cu(lengths), 260)
    assert out.dtype == torch.bfloat16
    ref = _sdpa_per_sequence(q16.float(), k16.float(), v16.float(), _cu(lengths), None)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=0)  # one rounding to bf16
    out.sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q16, k16, v16))


@pytest.mark.parametrize(
    ("lengths", "layout"),
    [([20] * 50, "rows"), ([*_long_tail(49, seed=1), 2048], "windowed")],
)
def test_one_sdpa_call_for_fifty_sequences(lengths: list[int], layout: str, sdpa_calls: list[int]) -> None:
    num_tokens, longest = sum(lengths), max(lengths)
    assert _prefer_padded_rows(len(lengths), longest, num_tokens) == (layout == "rows")
    q, k, v = (t.requires_grad_() for t in _qkv(num_tokens))
    packed_causal_attention(q, k, v, _cu(lengths), longest).sum().backward()
    assert len(sdpa_calls) == 1


def test_non_contiguous_inputs_like_hf_attention() -> None:
    lengths = _long_tail(6, seed=2)
    q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in _qkv(sum(lengths)))  # [H, T, D]^T
    assert not q.is_contiguous()
    out = packed_causal_attention(q, k, v, _cu(lengths), max(lengths))
    torch.testing.assert_close(out, _sdpa_per_sequence(q, k, v, _cu(lengths), None), atol=1e-5, rtol=0)


def test_block_size_follows_longest_sequence() -> None:
    assert [_block_size(n) for n in (1, 18, 64, 512, 2048, 100_000)] == [16, 16, 32, 128, 256, 256]


def test_empty_batch_and_bad_cu_seqlens() -> None:
    q, k, v = _qkv(0)
    assert packed_causal_attention(q, k, v, torch.tensor([0, 0], dtype=torch.int32), 0).shape == (0, 4, 16)
    q, k, v = _qkv(5)
    with pytest.raises(LengthMismatchError, match="non-decreasing"):
        packed_causal_attention(q, k, v, torch.tensor([0, 4, 2, 5]), 4)


def test_kernel_report_names_the_sdpa_layout_on_cpu() -> None:
    rows, windowed = [20] * 50, [*_long_tail(49, seed=1), 2048]
    q, _, _ = _qkv(8)
    assert packed_attention_kernel(q, _cu(rows)) == "sdpa padded rows"
    assert packed_attention_kernel(q, _cu(windowed)) == "sdpa windowed"
    assert packed_attention_kernel(q, _cu([0, 0])) == "sdpa padded rows"


def test_varlen_backend_refuses_cpu_tensors() -> None:
    lengths = [3, 5]
    q, k, v = (t.bfloat16() for t in _qkv(sum(lengths)))
    with pytest.raises(BackendUnavailableError, match="backend='varlen' needs CUDA"):
        packed_causal_attention(q, k, v, _cu(lengths), 5, backend="varlen")
    with pytest.raises(BackendUnavailableError, match="varlen"):
        packed_attention_kernel(q, _cu(lengths), backend="varlen")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_torch_varlen_kernel_matches_the_per_sequence_loop_on_cuda(kv_heads: int) -> None:
    lengths = [40, 1, 290, 0, 7]
    q, k, v = (t.cuda().bfloat16().requires_grad_() for t in _qkv(sum(lengths), kv_heads=kv_heads))
    cu = _cu(lengths).cuda()
    assert packed_attention_kernel(q, cu) in ("torch flash varlen", "flash-attn varlen")
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).cuda().bfloat16()
    packed_causal_attention(q, k, v, cu, max(lengths), backend="varlen").backward(grad_out)
    got = [t.grad for t in (q, k, v)]
    ref_inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    _sdpa_per_sequence(*ref_inputs, cu, None).backward(grad_out.float())
    for grad, ref in zip(got, ref_inputs, strict=True):
        assert grad is not None and ref.grad is not None
        torch.testing.assert_close(grad.float(), ref.grad, atol=3e-2, rtol=3e-2)
