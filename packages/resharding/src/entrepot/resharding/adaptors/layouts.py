"""Small pure functions between the weight layouts of training and inference engines.

Every function works on a full tensor or on one tensor-parallel shard of it (the number of
groups / experts is read from the shape), and on weights ``[rows, in]`` and biases ``[rows]``
alike: only dim 0 is rearranged.

Legend: G = query groups (= KV heads) in the tensor, P = query heads per group, D = head dim,
E = experts, I = expert / MLP intermediate size, H = hidden size, ``*`` = trailing dims.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from entrepot.resharding.errors import ShapeMismatchError

__all__ = [
    "deinterleave_qkv",
    "fuse_gate_up",
    "fused_qkv_to_interleaved",
    "interleave_qkv",
    "interleaved_qkv_to_fused",
    "shard_dim",
    "split_gate_up",
    "stack_experts",
    "unshard_dim",
    "unstack_experts",
]


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Separate q/k/v -> Megatron's per-group interleaved ``linear_qkv``.

    Shape:
        q: [G * P * D, *], k: [G * D, *], v: [G * D, *] -> [G * (P + 2) * D, *], laid out as
        ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]`` with ``q_g`` of P heads, so a contiguous TP
        shard holds whole groups.
    """
    num_groups = k.shape[0] // head_dim
    if k.shape != v.shape or k.shape[0] != num_groups * head_dim or q.shape[0] % (num_groups * head_dim):
        raise ShapeMismatchError(
            f"interleave_qkv: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not form "
            f"whole heads of head_dim {head_dim}"
        )
    rest = q.shape[1:]
    qg = q.reshape(num_groups, -1, *rest)  # [G, P*D, *]
    kg = k.reshape(num_groups, head_dim, *rest)  # [G, D, *]
    vg = v.reshape(num_groups, head_dim, *rest)  # [G, D, *]
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def deinterleave_qkv(
    qkv: torch.Tensor, heads_per_group: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's interleaved ``linear_qkv`` -> separate ``(q, k, v)`` (inverse of ``interleave_qkv``).

    Shape:
        qkv: [G * (P + 2) * D, *] -> q [G * P * D, *], k [G * D, *], v [G * D, *].
    """
    group_rows = (heads_per_group + 2) * head_dim
    if qkv.shape[0] % group_rows:
        raise ShapeMismatchError(
            f"deinterleave_qkv: {qkv.shape[0]} rows are not whole groups of (P + 2) * D = {group_rows}"
        )
    rest = qkv.shape[1:]
    groups = qkv.reshape(qkv.shape[0] // group_rows, group_rows, *rest)  # [G, (P+2)*D, *]
    q, k, v = groups.split([heads_per_group * head_dim, head_dim, head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def interleaved_qkv_to_fused(qkv: torch.Tensor, heads_per_group: int, head_dim: int) -> torch.Tensor:
    """Megatron's interleaved ``linear_qkv`` -> vLLM's ``qkv_proj`` ``[Q; K; V]`` (same rows)."""
    return torch.cat(deinterleave_qkv(qkv, heads_per_group, head_dim), dim=0)


def fused_qkv_to_interleaved(qkv: torch.Tensor, heads_per_group: int, head_dim: int) -> torch.Tensor:
    """vLLM's ``qkv_proj`` ``[Q; K; V]`` -> Megatron's interleaved ``linear_qkv``.

    The inverse of ``interleaved_qkv_to_fused``, written through ``interleave_qkv`` (not by
    undoing ``deinterleave_qkv``) so that the ``Resharder``'s round-trip check compares two
    independent routes. Shape: [G * (P + 2) * D, *] -> [G * (P + 2) * D, *].
    """
    group_rows = (heads_per_group + 2) * head_dim
    if qkv.shape[0] % group_rows:
        raise ShapeMismatchError(
            f"fused_qkv_to_interleaved: {qkv.shape[0]} rows are not whole groups of "
            f"(P + 2) * D = {group_rows}"
        )
    kv_rows = qkv.shape[0] // group_rows * head_dim  # G * D
    q, k, v = qkv.split([qkv.shape[0] - 2 * kv_rows, kv_rows, kv_rows], dim=0)
    return interleave_qkv(q, k, v, head_dim)


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Separate gate / up -> fused ``[gate; up]`` (Megatron ``linear_fc1``, vLLM ``gate_up_proj``).

    Shape: gate [I, *], up [I, *] -> [2 * I, *].
    """
    if gate.shape != up.shape:
        raise ShapeMismatchError(f"fuse_gate_up: gate {tuple(gate.shape)} != up {tuple(up.shape)}")
    return torch.cat([gate, up], dim=0)


def split_gate_up(fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``[gate; up]`` -> ``(gate, up)``. Shape: [2 * I, *] -> [I, *], [I, *]."""
    if fused.shape[0] % 2:
        raise ShapeMismatchError(f"split_gate_up: {fused.shape[0]} rows cannot split into gate and up")
    gate, up = fused.chunk(2, dim=0)
    return gate, up


def stack_experts(experts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-expert tensors (in expert order) -> one stacked tensor. Shape: E x [*] -> [E, *]."""
    if not experts:
        raise ShapeMismatchError("stack_experts got no tensors")
    return torch.stack(list(experts), dim=0)


def unstack_experts(stacked: torch.Tensor) -> list[torch.Tensor]:
    """One stacked tensor -> per-expert tensors. Shape: [E, *] -> E x [*]."""
    return list(stacked.unbind(0))


def shard_dim(
    tensor: torch.Tensor, dim: int, num_shards: int, index: int, fused_chunks: int = 1
) -> torch.Tensor:
    """Shard ``index`` of ``num_shards`` along ``dim``, the way Megatron's parallel linears cut it.

    With ``fused_chunks = c`` the dim holds c fused blocks (e.g. ``[gate; up]``) and the shard is
    the concatenation of the ``index``-th slice of each block, ``[gate_i; up_i]``.

    Shape: [..., N, ...] -> [..., N / num_shards, ...] along ``dim``.
    """
    size = tensor.shape[dim]
    if size % (fused_chunks * num_shards):
        raise ShapeMismatchError(
            f"shard_dim: size {size} of dim {dim} is not divisible by fused_chunks*num_shards = "
            f"{fused_chunks}*{num_shards}"
        )
    if num_shards == 1:
        return tensor
    chunks = tensor.chunk(fused_chunks, dim=dim)
    return torch.cat([chunk.chunk(num_shards, dim=dim)[index] for chunk in chunks], dim=dim)


def unshard_dim(shards: Sequence[torch.Tensor], dim: int, fused_chunks: int = 1) -> torch.Tensor:
    """The tensor ``shard_dim`` cut into ``shards`` (in shard order): its exact inverse.

    With ``fused_chunks = c`` each shard is ``[block_0 slice; ...; block_{c-1} slice]``; the
    blocks are reassembled one by one, ``[gate_0; gate_1; ...; up_0; up_1; ...]``.

    Shape: num_shards x [..., N / num_shards, ...] -> [..., N, ...] along ``dim``.
    """
    if not shards:
        raise ShapeMismatchError("unshard_dim got no shards")
    shapes = {tuple(shard.shape) for shard in shards}
    if len(shapes) != 1:
        raise ShapeMismatchError(f"unshard_dim: shards of different shapes {sorted(shapes)}")
    if shards[0].shape[dim] % fused_chunks:
        raise ShapeMismatchError(
            f"unshard_dim: size {shards[0].shape[dim]} of dim {dim} is not divisible by "
            f"fused_chunks = {fused_chunks}"
        )
    if len(shards) == 1:
        return shards[0]
    pieces = [shard.chunk(fused_chunks, dim=dim) for shard in shards]  # [shard][chunk]
    return torch.cat([piece[k] for k in range(fused_chunks) for piece in pieces], dim=dim)
