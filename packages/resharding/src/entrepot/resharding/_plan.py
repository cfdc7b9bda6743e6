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

__all__ = ["ParamPlan", "Payload", "ReshardPlan", "Round", "Segment", "build_plan"]

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
    staged: bool  # its inference weight is a layout change (not a rename): assembled in scratch first

    def dst_bytes(self, rank: int) -> int:
        """Bytes of ``rank``'s shard (0 when ``rank`` does not need this parameter)."""
        shape = self.dst_shapes.get(rank)
        return 0 if shape is None else math.prod(shape) * self.dtype.itemsize


@dataclass
class Payload:
    """One contiguous message: ``segments`` packed in order, sent unchanged to every rank in ``dsts``."""

    dsts: list[int]
    segments: list[Segment]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


@dataclass
class Round:
    """Slices moved by one bucketed exchange, and the staged groups converted after it."""

    staged_groups: list[list[str]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    # payloads / incoming / scratch layouts, computed once per plan (the plan is reused per reshard)
    cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False, compare=False)

    def dtypes(self) -> list[torch.dtype]:
        """The dtypes that cross ranks in this round, in a fixed order."""
        seen = {s.dtype: None for s in self.segments if s.src != s.dst}
        return sorted(seen, key=str)

    def payloads(self, rank: int, dtype: torch.dtype) -> list[Payload]:
        """What ``rank`` sends of ``dtype``: one payload per distinct content, shared by its receivers.

        Gathers and broadcasts send the same slices to several ranks; packing them once keeps
        the send bucket at the size of the data rather than data x receivers.
        """
        cached = self.cache.get(("payloads", rank, dtype))
        if cached is not None:
            return cached  # type: ignore[return-value]
        per_dst: dict[int, list[Segment]] = {}
        for seg in self.segments:
            if seg.src == rank != seg.dst and seg.dtype == dtype:
                per_dst.setdefault(seg.dst, []).append(seg)
        unique: dict[tuple[tuple[str, int, int], ...], Payload] = {}
        for dst, segs in sorted(per_dst.items()):
            key = tuple((s.name, s.src_start, s.length) for s in segs)
            if key in unique:
                unique[key].dsts.append(dst)
            else:
                unique[key] = Payload([dst], segs)
        self.cache["payloads", rank, dtype] = payloads = list(unique.values())
        return payloads

    def incoming(self, rank: int, dtype: torch.dtype) -> dict[int, list[Segment]]:
        """What ``rank`` receives of ``dtype``: ``{src: segments in packing order}``."""
        cached = self.cache.get(("incoming", rank, dtype))
        if cached is not None:
            return cached  # type: ignore[return-value]
        per_src: dict[int, list[Segment]] = {}
        for seg in self.segments:
            if seg.dst == rank != seg.src and seg.dtype == dtype:
                per_src.setdefault(seg.src, []).append(seg)
        self.cache["incoming", rank, dtype] = incoming = dict(sorted(per_src.items()))
        return incoming


@dataclass
class ReshardPlan:
    """Everything a rank needs to run a reshard."""

    params: dict[str, ParamPlan]
    groups: list[list[str]]  # conversion groups (train_to_infer inputs), in plan order
    rounds: list[Round]
    world_size: int
    # False for shared-memory arenas: a receiver reads the sender's arena, so it needs no buffer
    receive_buffers: bool = True

    @property
    def crosses_ranks(self) -> bool:
        """Whether any slice moves between ranks (else every rank copies its own)."""
        return any(rnd.dtypes() for rnd in self.rounds)

    def needed(self, rank: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Training-layout shards ``rank`` assembles: ``{name: (shape, dtype)}``."""
        return {p.name: (p.dst_shapes[rank], p.dtype) for p in self.params.values() if rank in p.dst_shapes}

    def scratch_layout(self, rnd: Round, rank: int) -> tuple[dict[str, tuple[int, int]], int]:
        """Where ``rank`` keeps one round's scratch inside its arena: ``{key: (byte offset, bytes)}``.

        Keys: ``"send:<dtype>:<i>"`` for payload i, ``"recv:<dtype>:<src>"`` for the message
        from ``src``, and the parameter name for a staged shard. Returns the layout and its size.
        """
        cached = rnd.cache.get(("layout", rank))
        if cached is not None:
            return cached  # type: ignore[return-value]
        sizes: dict[str, int] = {}
        for dtype in rnd.dtypes():
            for index, payload in enumerate(rnd.payloads(rank, dtype)):
                sizes[f"send:{dtype}:{index}"] = payload.nbytes
            for src, segs in rnd.incoming(rank, dtype).items() if self.receive_buffers else ():
                sizes[f"recv:{dtype}:{src}"] = sum(s.nbytes for s in segs)
        for group in rnd.staged_groups:
            for name in group:
                if rank in self.params[name].dst_shapes:
                    sizes[name] = self.params[name].dst_bytes(rank)
        layout: dict[str, tuple[int, int]] = {}
        offset = 0
        for key, size in sizes.items():
            layout[key] = (offset, size)
            offset += _aligned(size)
        rnd.cache["layout", rank] = (layout, offset)
        return layout, offset

    def shared_reads(self, rnd: Round, rank: int, dtype: torch.dtype) -> list[tuple[int, int, list[Segment]]]:
        """Where ``rank`` finds its incoming ``dtype`` slices in the senders' arenas (shared memory).

        Returns ``(src, byte offset in src's arena, segments packed there in order)`` per sender:
        the payload of ``src`` whose receivers include ``rank``, at its place in ``src``'s layout.
        """
        reads = []
        for src, segs in rnd.incoming(rank, dtype).items():
            index = next(i for i, p in enumerate(rnd.payloads(src, dtype)) if rank in p.dsts)
            reads.append((src, self.scratch_layout(rnd, src)[0][f"send:{dtype}:{index}"][0], segs))
        return reads

    def arena_bytes(self, rank: int) -> int:
        """The largest round scratch of ``rank``: the size of its arena."""
        return max((self.scratch_layout(rnd, rank)[1] for rnd in self.rounds), default=0)


ALIGN_BYTES = 256


def _aligned(size: int) -> int:
    return -(-size // ALIGN_BYTES) * ALIGN_BYTES


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
    receive_buffers: bool = True,
) -> ReshardPlan:
    """The plan for moving the training shards described by ``metas`` (one per rank) to ``infer``.

    ``receive_buffers=False`` (shared-memory arenas): received bytes take no scratch, so rounds
    are bounded by what a rank sends and stages, and fewer of them are needed.
    """
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
        staged = adaptor.infer_alias(name) is None
        params[name] = ParamPlan(name, dtype, full, spec, dst_shapes, staged)
        segments_of[name] = moves
    groups, rounds = _rounds(adaptor, params, segments_of, bucket_bytes, world, receive_buffers)
    return ReshardPlan(params, groups, rounds, world, receive_buffers)


def _rounds(
    adaptor: WeightAdaptor,
    params: Mapping[str, ParamPlan],
    moves: Mapping[str, list[tuple[int, int, int, int, int]]],
    bucket_bytes: int,
    world: int,
    receive_buffers: bool,
) -> tuple[list[list[str]], list[Round]]:
    """Pack the moves into rounds so that no rank's scratch exceeds ``bucket_bytes``.

    A rank's scratch in a round is what it sends and receives plus, for staged parameters,
    the assembled shard and its converted copy. A staged group moves in one round (it is
    converted as a whole); the slices of renamed parameters are cut into pieces of at most a
    quarter bucket, so one huge embedding no longer needs a huge bucket.
    """
    groups = adaptor.infer_groups(list(params))
    rounds: list[Round] = []
    current, used = Round(), [0] * world
    index = 0

    def place(segments: list[Segment], staged: list[str] | None) -> None:
        nonlocal current, used
        cost = [0] * world
        for seg in segments:
            if seg.src != seg.dst:
                cost[seg.src] += seg.nbytes  # an upper bound: payload sharing only lowers it
                cost[seg.dst] += seg.nbytes if receive_buffers else 0
        for name in staged or []:
            for rank in params[name].dst_shapes:
                cost[rank] += 2 * params[name].dst_bytes(rank)
        if current.segments and any(u + c > bucket_bytes for u, c in zip(used, cost, strict=True)):
            rounds.append(current)
            current, used = Round(), [0] * world
        current.segments.extend(segments)
        if staged:
            current.staged_groups.append(staged)
        used = [u + c for u, c in zip(used, cost, strict=True)]

    for group in groups:
        staged = [n for n in group if params[n].staged]
        group_segments: list[Segment] = []
        for name in group:
            plan = params[name]
            dim = plan.spec.tp_dim if plan.spec.tp_dim is not None else 0
            row = (
                math.prod(plan.full_shape) // plan.full_shape[dim] if plan.full_shape else 1
            ) * plan.dtype.itemsize
            step = max(1, bucket_bytes // 4 // row) if not plan.staged else None
            for src, dst, src_start, dst_start, length in moves[name]:
                pieces = range(0, length, step or length) if length else [0]
                for first in pieces:
                    size = min(length - first, step or length)
                    segment = Segment(
                        index,
                        name,
                        src,
                        dst,
                        dim,
                        src_start + first,
                        dst_start + first,
                        size,
                        size * row // plan.dtype.itemsize,
                        plan.dtype,
                    )
                    index += 1
                    if plan.staged:
                        group_segments.append(segment)
                    else:
                        place([segment], None)
        if staged:
            place(group_segments, staged)
    if current.segments:
        rounds.append(current)
    return groups, rounds
