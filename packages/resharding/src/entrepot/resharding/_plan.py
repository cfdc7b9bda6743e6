"""The transfer plan of a reshard: which rank sends which slice of which parameter to whom.

Pure and deterministic: every rank builds the same plan from the same gathered metadata, so
the collectives that execute it line up without further negotiation.

A training parameter is cut along its ``tp_dim`` into ``fused_chunks`` blocks, each split
evenly across the TP (or expert-TP) ranks. A destination shard under the inference layout is
the same kind of cut with other sizes; each of its blocks is covered by the intersections with
the source pieces, one *segment* per intersection. A rank that already holds a segment copies
it locally; replicas (data-parallel copies, TP-replicated norms) are spread over senders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from entrepot.resharding.adaptors.base import ParamSpec, WeightAdaptor
from entrepot.resharding.errors import LayoutError, ShapeMismatchError
from entrepot.resharding.layout import ParallelLayout, RankCoords

__all__ = ["ParamPlan", "ReshardPlan", "Round", "Segment", "build_plan"]

LocalMeta = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class Segment:
    """One contiguous range along ``dim`` of one parameter, from ``src`` to ``dst``.

    ``src_start`` indexes the source rank's local shard, ``dst_start`` the destination shard;
    ``dim`` is the TP dim (0 for a replicated parameter moved whole).
    """

    index: int  # position in the global plan: the order of segments inside every bucket
    name: str
    src: int
    dst: int
    dim: int
    src_start: int
    dst_start: int
    length: int
    numel: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class ParamPlan:
    """A training parameter: its full shape and the shard shape each destination gets."""

    name: str
    dtype: torch.dtype
    full_shape: tuple[int, ...]
    spec: ParamSpec
    dst_shapes: dict[int, tuple[int, ...]]  # rank -> training-layout shard under the inference layout


@dataclass
class Round:
    """Groups converted together after one bucketed exchange."""

    groups: list[list[str]]
    segments: list[Segment] = field(default_factory=list)

    def dtypes(self) -> list[torch.dtype]:
        """The dtypes that cross ranks in this round, in a fixed order."""
        seen = {s.dtype: None for s in self.segments if s.src != s.dst}
        return sorted(seen, key=str)


@dataclass
class ReshardPlan:
    """Everything a rank needs to run a reshard."""

    params: dict[str, ParamPlan]
    rounds: list[Round]
    world_size: int

    def needed(self, rank: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Training-layout shards ``rank`` assembles: ``{name: (shape, dtype)}``."""
        return {p.name: (p.dst_shapes[rank], p.dtype) for p in self.params.values() if rank in p.dst_shapes}

    def max_bucket_elems(self, rank: int) -> dict[tuple[str, torch.dtype], int]:
        """Largest send / recv elements of any round, per ``(direction, dtype)``, for ``rank``."""
        sizes: dict[tuple[str, torch.dtype], int] = {}
        for rnd in self.rounds:
            totals: dict[tuple[str, torch.dtype], int] = {}
            for s in rnd.segments:
                if s.src == s.dst:
                    continue
                if s.src == rank:
                    totals[("send", s.dtype)] = totals.get(("send", s.dtype), 0) + s.numel
                if s.dst == rank:
                    totals[("recv", s.dtype)] = totals.get(("recv", s.dtype), 0) + s.numel
            for key, value in totals.items():
                sizes[key] = max(sizes.get(key, 0), value)
        return sizes


def _piece(coords: RankCoords, spec: ParamSpec, layout: ParallelLayout) -> tuple[int, int]:
    """``(shard index, number of shards)`` of a rank's piece of a parameter."""
    if spec.is_expert:
        return coords.etp_rank, layout.etp
    return coords.tp_rank, layout.tp


def _gather_params(
    adaptor: WeightAdaptor, metas: Sequence[LocalMeta], train: ParallelLayout, world: int
) -> dict[str, tuple[ParamSpec, torch.dtype, tuple[int, ...], dict[int, list[int]]]]:
    """Name -> (spec, dtype, full shape, {piece index: holder ranks})."""
    found: dict[str, tuple[ParamSpec, torch.dtype, tuple[int, ...], dict[int, list[int]]]] = {}
    for rank, meta in enumerate(metas):
        coords = train.coords(rank, world)
        for name, (shape, dtype) in meta.items():
            spec = adaptor.param_spec(name)
            piece, num = _piece(coords, spec, train)
            full = list(shape)
            if spec.tp_dim is not None:
                full[spec.tp_dim] *= num
            if name not in found:
                found[name] = (spec, dtype, tuple(full), {})
            _, known_dtype, known_full, holders = found[name]
            if known_full != tuple(full) or known_dtype != dtype:
                raise ShapeMismatchError(
                    f"{name!r}: rank {rank} holds {tuple(shape)} {dtype}, implying full {tuple(full)}; "
                    f"another rank implies {known_full} {known_dtype}"
                )
            holders.setdefault(piece if spec.tp_dim is not None else 0, []).append(rank)
    for name, (spec, _, _, holders) in found.items():
        expected = 1 if spec.tp_dim is None else (train.etp if spec.is_expert else train.tp)
        if len(holders) != expected:
            raise LayoutError(
                f"{name!r}: ranks hold pieces {sorted(holders)} of {expected}; some pieces are missing"
            )
    return found


def _ranges(full: int, chunks: int, num: int, index: int) -> list[tuple[int, int]]:
    """Full-tensor ranges ``[start, stop)`` of shard ``index`` of ``num`` (one per fused chunk)."""
    block, part = full // chunks, full // (chunks * num)
    return [(c * block + index * part, c * block + (index + 1) * part) for c in range(chunks)]


def build_plan(
    adaptor: WeightAdaptor,
    metas: Sequence[LocalMeta],
    train: ParallelLayout,
    infer: ParallelLayout,
    bucket_bytes: int,
) -> ReshardPlan:
    """The plan for moving the training shards described by ``metas`` (one per rank) to ``infer``."""
    world = len(metas)
    infer.validate_world(world)
    gathered = _gather_params(adaptor, metas, train, world)
    infer_coords = [infer.coords(r, world) for r in range(world)]
    params: dict[str, ParamPlan] = {}
    segments_of: dict[
        str, list[tuple[int, int, int, int, int]]
    ] = {}  # (src, dst, src_start, dst_start, length)
    for name, (spec, dtype, full, holders) in gathered.items():
        dim = spec.tp_dim if spec.tp_dim is not None else 0
        length = full[dim] if full else 1
        dst_shapes: dict[int, tuple[int, ...]] = {}
        moves: list[tuple[int, int, int, int, int]] = []
        for dst, coords in enumerate(infer_coords):
            if spec.is_expert and adaptor.owner_ep_rank(spec, infer) != coords.ep_rank:
                continue
            if spec.tp_dim is None:
                candidates = holders[0]
                src = dst if dst in candidates else candidates[dst % len(candidates)]
                dst_shapes[dst] = full
                moves.append((src, dst, 0, 0, length))
                continue
            index, num = _piece(coords, spec, infer)
            if length % (spec.fused_chunks * num):
                raise LayoutError(
                    f"{name!r}: dim {dim} of size {length} cannot split into "
                    f"{spec.fused_chunks} chunk(s) x {num} shards"
                )
            shape = list(full)
            shape[dim] = length // num
            dst_shapes[dst] = tuple(shape)
            dst_ranges = _ranges(length, spec.fused_chunks, num, index)
            dst_offsets = [0]
            for start, stop in dst_ranges:
                dst_offsets.append(dst_offsets[-1] + stop - start)
            for piece, candidates in sorted(holders.items()):
                src = dst if dst in candidates else candidates[dst % len(candidates)]
                src_ranges = _ranges(length, spec.fused_chunks, len(holders), piece)
                src_offset = 0
                for (s0, s1), (d0, d1), d_off in zip(src_ranges, dst_ranges, dst_offsets[:-1], strict=True):
                    lo, hi = max(s0, d0), min(s1, d1)
                    if lo < hi:
                        moves.append((src, dst, src_offset + lo - s0, d_off + lo - d0, hi - lo))
                    src_offset += s1 - s0
        params[name] = ParamPlan(name, dtype, full, spec, dst_shapes)
        segments_of[name] = moves
    rounds = _rounds(adaptor, params, segments_of, bucket_bytes)
    return ReshardPlan(params, rounds, world)


def _rounds(
    adaptor: WeightAdaptor,
    params: Mapping[str, ParamPlan],
    moves: Mapping[str, list[tuple[int, int, int, int, int]]],
    bucket_bytes: int,
) -> list[Round]:
    """Pack conversion groups into rounds of at most ``bucket_bytes`` (a larger group goes alone)."""
    rounds: list[Round] = []
    current = Round(groups=[])
    current_bytes = 0
    index = 0
    for group in adaptor.infer_groups(list(params)):
        group_bytes = sum(math.prod(params[n].full_shape) * params[n].dtype.itemsize for n in group)
        if current.groups and current_bytes + group_bytes > bucket_bytes:
            rounds.append(current)
            current, current_bytes = Round(groups=[]), 0
        current.groups.append(group)
        current_bytes += group_bytes
        for name in group:
            plan = params[name]
            dim = plan.spec.tp_dim if plan.spec.tp_dim is not None else 0
            inner = math.prod(plan.full_shape) // max(1, plan.full_shape[dim] if plan.full_shape else 1)
            for src, dst, src_start, dst_start, length in moves[name]:
                numel = length * inner if plan.full_shape else 1
                current.segments.append(
                    Segment(index, name, src, dst, dim, src_start, dst_start, length, numel, plan.dtype)
                )
                index += 1
    if current.groups:
        rounds.append(current)
    return rounds
