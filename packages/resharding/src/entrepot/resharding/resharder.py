"""``Resharder``: every rank's inference shard from the training shards, with bucketed collectives.

The plan (``_plan.build_plan``) lists every slice that must move: across TP ranks when the TP
sizes differ (gather when training TP > inference TP, split when <), across pipeline stages
(inference has PP = 1, so every stage's weights reach every rank: a broadcast) and across
expert-parallel blocks (experts sent to their new owners). It is executed in rounds; in each
round a rank packs its outgoing slices of one dtype into payloads (one per distinct content, so
a slice that three ranks need is packed once) and posts all its sends and receives as one
batched exchange (``batch_isend_irecv``): the number of exchanges is ``rounds x dtypes``, not
the number of tensors.

Received slices are written straight into the output ``ModelWeightBuffer`` when the
inference weight is a renamed training weight, and through per-round staging when a layout
change is needed (QKV de-interleave, expert stacking, MLA split). Buckets and staging live in
one byte arena (a ``MemoryBuffer``) and rounds are packed so that no rank's scratch (sent +
received bytes + staged shards and their converted copies) exceeds ``bucket_bytes``: peak
extra memory is the inference copy plus one bucket (a single group larger than the bucket
gets a round of its own).

On CPU, when every rank of the group is on this host, the arenas are files in shared memory
(``_shared``) that peers map: a slice is packed once by its sender and copied by each receiver
straight from the sender's arena into place, instead of crossing gloo's TCP sockets (four
copies and the loopback stack). Elsewhere, or with ``shared_memory=False``, the exchanges go
through the process group.

With ``verify=True``:

* every slice is checksummed at its source and at its destination with a position-mixed
  checksum (``_checksum``: every 16-bit word weighted by a hash of its position, no period),
  so a changed element, or two swapped at any distance, is caught;
* every layout conversion is checked by a round trip (``_conversion_check``): the inference
  tensors, mapped back by the adaptor's independent inverse ``infer_to_train``, must equal the
  staged training-layout tensors bit for bit, so a permuted or wrongly split conversion is
  caught and named.

The checks stay on the device (one host sync per reshard) and are all-reduced; a mismatch raises
``ChecksumMismatchError`` on every rank, naming the slices and parameters, before any weight
reaches the inference engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from entrepot.resharding._checksum import checksums
from entrepot.resharding._conversion_check import ConversionCheck, raise_on_mismatch
from entrepot.resharding._plan import ReshardPlan, Round, build_plan
from entrepot.resharding._shared import SHM_DIR, SharedArenas, new_token, open_shared_arenas
from entrepot.resharding._transport import exchange_dtype, pack, read_shared, region
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.buffers import MemoryBuffer, ModelWeightBuffer, TensorMeta
from entrepot.resharding.errors import LayoutError, ReshardError
from entrepot.resharding.layout import ParallelLayout

__all__ = ["DEFAULT_BUCKET_BYTES", "ReshardStats", "Resharder"]

DEFAULT_BUCKET_BYTES = 256 * 2**20


@dataclass
class ReshardStats:
    """What the last ``reshard()`` did on this rank."""

    seconds: float = 0.0
    num_rounds: int = 0
    num_collectives: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_local: int = 0  # copied from this rank's own training shard
    output_bytes: int = 0  # the inference weights (ModelWeightBuffer)
    scratch_bytes: int = 0  # the arena: buckets + staging of the largest round
    transport: str = "local"  # how slices crossed ranks: "local" (none did), "shared_memory", "group"


class Resharder:
    """Turns this rank's training shard into its inference shard.

    Args:
        adaptor: the model's ``WeightAdaptor`` (names, TP specs, layout conversions).
        train_layout: TP / PP / EP (and optional VPP, expert TP) of the training engine.
        infer_layout: TP / EP (PP must be 1) of the inference engine on the same ranks.
        group: the process group spanning both engines (default: the world).
        bucket_bytes: scratch bytes per rank and round (sent + received + staged); larger
            buckets mean fewer collectives and more scratch memory.
        verify: checksum every slice at both ends and round-trip every layout conversion;
            mismatches raise ``ChecksumMismatchError`` (see the module docstring for the cost).
        device: where the inference weights live (default: the training shard's device).
        shared_memory: on CPU, exchange through shared memory when every rank of the group is on
            this host (checked once, by mapping each other's arenas); False: always through
            the process group.

    Example:
        >>> resharder = Resharder(adaptor, ParallelLayout(tp=2, pp=2), ParallelLayout(tp=1))
        >>> infer_weights = resharder.reshard(dict(model.named_parameters()))  # global names
        >>> engine.load_weights(infer_weights.items())
        >>> resharder.destroy_buffers()  # after the engine copied or released them
    """

    def __init__(
        self,
        adaptor: WeightAdaptor,
        train_layout: ParallelLayout,
        infer_layout: ParallelLayout,
        group: dist.ProcessGroup | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        verify: bool = False,
        device: torch.device | str | None = None,
        shared_memory: bool = True,
    ) -> None:
        if infer_layout.pp != 1:
            raise LayoutError(f"the inference layout must have pp=1, got pp={infer_layout.pp}")
        if bucket_bytes < 1:
            raise LayoutError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.adaptor = adaptor
        self.train_layout = train_layout
        self.infer_layout = infer_layout
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.verify = verify
        self.device = None if device is None else torch.device(device)
        self.stats = ReshardStats()
        self.weights: ModelWeightBuffer | None = None
        self._plan: ReshardPlan | None = None
        self._metas: list[dict[str, tuple[tuple[int, ...], torch.dtype]]] | None = None
        self._arena: MemoryBuffer | None = None
        self._shared_memory = shared_memory  # turned off for good when a rank cannot map its peers
        self._token: str | None = None  # names this resharder's shared-memory files
        self._opened: SharedArenas | None = None  # opened while planning, for the next reshard

    # -- public ----------------------------------------------------------------------------
    def reshard(self, local_train_params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's inference weights ``{inference name: tensor}``.

        Args:
            local_train_params: this rank's training-layout shard, keyed by *global* training
                names (global layer and expert indices), as ``WeightAdaptor.shard`` cuts them.

        Returns:
            Tensors aliasing ``self.weights``; valid until ``destroy_buffers()``.
        """
        start = time.perf_counter()
        rank, world = self._rank_world()
        local = {name: tensor.detach() for name, tensor in local_train_params.items()}
        device = self.device or next((t.device for t in local.values()), torch.device("cpu"))
        plan = self._plan_for(local, rank, world, device)
        weights = self._output_buffer(plan, rank, device)
        shared = self._shared_arenas(plan, rank)
        arena = None if shared is not None else self._arena_buffer(plan, rank, weights.buffer.device)
        if shared is not None:
            scratch = shared.mine
        else:
            scratch = arena.get("arena") if arena is not None else torch.empty(0, dtype=torch.uint8)
        crosses = plan.crosses_ranks
        stats = ReshardStats(
            num_rounds=len(plan.rounds),
            output_bytes=weights.nbytes,
            scratch_bytes=scratch.numel(),
            transport="local" if not crosses else "shared_memory" if shared is not None else "group",
        )
        # [segment, (source checksum, destination checksum)]; the last row counts bad conversions.
        # On the weights' device so that NCCL/HCCL can reduce it.
        num_segments = sum(len(r.segments) for r in plan.rounds)
        checks = torch.zeros(num_segments + 1, 2, dtype=torch.int64, device=weights.buffer.device)
        conversions = ConversionCheck(self.adaptor)
        with torch.no_grad():
            for index, rnd in enumerate(plan.rounds):
                if shared is not None and index > 0 and rnd.dtypes():
                    dist.barrier(group=self.group)  # every rank has read the last round's arenas
                self._run_round(rnd, rank, local, weights, scratch, shared, stats, checks, conversions)
        del scratch, shared  # unmaps this rank's shared arena (peers keep theirs until they drop it)
        if arena is not None:
            arena.destroy()
        if self.verify:
            failed = conversions.failures()
            checks[-1, 1] = len(failed)
            raise_on_mismatch(plan, checks, [f"rank {rank}: {line}" for line in failed], self.group)
        stats.seconds = time.perf_counter() - start
        self.stats = stats
        return weights.named_tensors()

    def destroy_buffers(self) -> None:
        """Free the inference weights (the layout is kept; the next ``reshard`` re-allocates)."""
        if self.weights is not None:
            self.weights.destroy()

    # -- setup -----------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        if not dist.is_available() or not dist.is_initialized():
            return 0, 1
        return dist.get_rank(self.group), dist.get_world_size(self.group)

    def _plan_for(
        self, local: Mapping[str, torch.Tensor], rank: int, world: int, device: torch.device
    ) -> ReshardPlan:
        meta = {name: (tuple(t.shape), t.dtype) for name, t in local.items()}
        metas: list[dict[str, tuple[tuple[int, ...], torch.dtype]]] = [meta]
        if world > 1:
            metas = [{} for _ in range(world)]
            dist.all_gather_object(metas, meta, group=self.group)
        if self._plan is None or metas != self._metas:
            self.train_layout.validate_world(world)
            shared = self._shared_memory and device.type == "cpu" and world > 1
            self._plan = self._build(metas, receive_buffers=not shared)
            self._opened = None
            if shared and self._plan.crosses_ranks:
                # Try the arenas now: if some rank cannot map them, every rank plans for the group.
                self._opened = self._open_shared(self._plan, rank)
                if self._opened is None:
                    self._shared_memory = False
                    self._plan = self._build(metas, receive_buffers=True)
            self._metas = metas
            self.weights = None
            self._arena = None
        return self._plan

    def _build(self, metas: list[dict[str, TensorMeta]], receive_buffers: bool) -> ReshardPlan:
        return build_plan(
            self.adaptor, metas, self.train_layout, self.infer_layout, self.bucket_bytes, receive_buffers
        )

    def _output_buffer(self, plan: ReshardPlan, rank: int, device: torch.device) -> ModelWeightBuffer:
        if self.weights is None:
            needed = plan.needed(rank)
            meta: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
            for group in plan.groups:
                mine = [n for n in group if n in needed]
                if mine:
                    meta.update(self._infer_meta(mine, needed))
            self.weights = ModelWeightBuffer(meta, device)
        elif not self.weights.buffer.is_allocated:
            self.weights.rebuild()
        return self.weights

    def _infer_meta(
        self, names: Sequence[str], needed: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Inference names, shapes and dtypes that ``names`` (one conversion group) turn into."""
        aliases = {n: self.adaptor.infer_alias(n) for n in names}
        if all(alias is not None for alias in aliases.values()):
            return {alias: needed[n] for n, alias in aliases.items() if alias is not None}
        # A layout change: run it once on scratch tensors of the right shapes (CPU, one group;
        # meta tensors would pull in torch._dynamo for torch.cat, seconds of import time).
        scratch = {n: torch.empty(needed[n][0], dtype=needed[n][1]) for n in names}
        return {n: (tuple(t.shape), t.dtype) for n, t in self.adaptor.train_to_infer(scratch).items()}

    def _open_shared(self, plan: ReshardPlan, rank: int) -> SharedArenas | None:
        if self._token is None:
            self._token = new_token(self.group)
        sizes = [plan.arena_bytes(r) for r in range(plan.world_size)]
        return open_shared_arenas(self._token, rank, sizes, self.group)

    def _shared_arenas(self, plan: ReshardPlan, rank: int) -> SharedArenas | None:
        """Every rank's arena in shared memory, for a plan made for them (None otherwise).

        The first reshard of a plan uses the arenas opened when it was made; later ones open
        them anew (the arenas are freed between reshards, as the group transport's are).
        """
        opened, self._opened = self._opened, None
        if plan.receive_buffers or not plan.crosses_ranks:
            return None
        shared = opened or self._open_shared(plan, rank)
        if shared is None:  # they could be mapped when the plan was made: /dev/shm filled up since
            raise ReshardError(
                f"rank {rank}: the shared-memory arenas ({plan.arena_bytes(rank)} bytes on this rank) "
                f"could not be mapped in {SHM_DIR}; free space there or pass shared_memory=False"
            )
        return shared

    def _arena_buffer(self, plan: ReshardPlan, rank: int, device: torch.device) -> MemoryBuffer | None:
        """One byte arena holding a round's buckets and staging; sized for the largest round."""
        size = plan.arena_bytes(rank)
        if size == 0:
            return None
        if self._arena is None:
            self._arena = MemoryBuffer({"arena": ((size,), torch.uint8)}, device)
        else:
            self._arena.rebuild()
        return self._arena

    # -- one round -------------------------------------------------------------------------
    def _run_round(
        self,
        rnd: Round,
        rank: int,
        local: Mapping[str, torch.Tensor],
        weights: ModelWeightBuffer,
        scratch: torch.Tensor,
        shared: SharedArenas | None,
        stats: ReshardStats,
        checks: torch.Tensor,
        conversions: ConversionCheck,
    ) -> None:
        """Move one round's slices into place and convert its staged groups."""
        assert self._plan is not None
        params = self._plan.params
        regions, _ = self._plan.scratch_layout(rnd, rank)

        def carve(key: str, dtype: torch.dtype) -> torch.Tensor:
            offset, size = regions.get(key, (0, 0))
            return scratch[offset : offset + size].view(dtype)

        targets: dict[str, torch.Tensor] = {}
        for seg in rnd.segments:
            if seg.dst == rank and seg.name not in targets:
                param = params[seg.name]
                alias = None if param.staged else self.adaptor.infer_alias(seg.name)
                if alias is not None:
                    targets[seg.name] = weights[alias]
                else:
                    targets[seg.name] = carve(seg.name, param.dtype).view(param.dst_shapes[rank])

        for seg in rnd.segments:
            if seg.src == rank == seg.dst:
                source = region(local[seg.name], seg, seg.src_start)
                region(targets[seg.name], seg, seg.dst_start).copy_(source)
                stats.bytes_local += seg.nbytes
        dtypes = rnd.dtypes()
        if shared is None:
            for dtype in dtypes:
                exchange_dtype(self.group, rnd, dtype, rank, local, targets, carve, stats)
        elif dtypes:
            for dtype in dtypes:
                pack(rnd, dtype, rank, local, carve, stats)
            dist.barrier(group=self.group)  # every rank has packed this round
            for dtype in dtypes:
                read_shared(self._plan, rnd, dtype, rank, shared, targets, stats)
        self._landed(rnd, rank, targets)
        if self.verify:  # every slice of the round at both ends, in one batched checksum per end
            sent = [seg for seg in rnd.segments if seg.src == rank]
            landed = [seg for seg in rnd.segments if seg.dst == rank]
            for end, segs, slices in (
                (0, sent, [region(local[seg.name], seg, seg.src_start) for seg in sent]),
                (1, landed, [region(targets[seg.name], seg, seg.dst_start) for seg in landed]),
            ):
                if segs:
                    rows = torch.tensor([seg.index for seg in segs], device=checks.device)
                    checks[rows, end] = checksums(slices).to(checks.device)

        for group in rnd.staged_groups:
            names = [n for n in group if n in targets]
            if not names:
                continue
            converted = self.adaptor.train_to_infer({n: targets[n] for n in names})
            weights.copy_by_name(converted)
            if self.verify:  # what landed in the output buffer must map back to the staged shard
                conversions.add({n: targets[n] for n in names}, {n: weights[n] for n in converted})

    def _landed(self, rnd: Round, rank: int, targets: Mapping[str, torch.Tensor]) -> None:
        """Called when a round's slices are in place, before they are checked (a seam for tests)."""
