"""Parallel layouts and the rank -> coordinates map shared by training and inference.

Rank order follows Megatron's default ``tp-dp-pp`` for dense weights and ``etp-ep-dp-pp`` for
experts: ranks ``[0, W/pp)`` form pipeline stage 0, and inside a stage TP is the fastest-varying
coordinate. Expert parallelism is carved out of the ranks of one stage (``tp * dp`` of them):
``expert_tp`` ranks shard one expert's matrices, ``ep`` such blocks hold disjoint experts.
Megatron's default is ``expert_tp == tp``; vLLM's expert parallel mode is ``expert_tp == 1``.

Legend: W = world size, L = number of decoder layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from entrepot.resharding.errors import LayoutError

__all__ = ["ParallelLayout", "RankCoords", "layers_of_stage", "stage_of_layer"]


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits in a layout (all ranks 0-based)."""

    rank: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    ep_rank: int
    etp_rank: int


@dataclass(frozen=True)
class ParallelLayout:
    """Tensor / pipeline / expert parallel sizes of one engine.

    Args:
        tp: tensor-parallel size (dense weights).
        pp: pipeline-parallel size (must be 1 for an inference layout).
        ep: expert-parallel size: experts are split into ``ep`` disjoint blocks.
        vpp: virtual pipeline size (interleaved schedule): each stage holds ``vpp`` chunks of
            ``L / (pp * vpp)`` layers; ``None`` = one chunk per stage.
        expert_tp: tensor-parallel size inside one expert; ``None`` means ``tp`` (Megatron's
            default). Set 1 for vLLM's expert-parallel mode (experts whole, spread over ranks).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int | None = None
    expert_tp: int | None = None

    def __post_init__(self) -> None:
        for field in ("tp", "pp", "ep"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"ParallelLayout.{field} must be an int >= 1, got {value!r}")
        for field in ("vpp", "expert_tp"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise LayoutError(f"ParallelLayout.{field} must be None or an int >= 1, got {value!r}")
        if self.vpp is not None and self.pp == 1 and self.vpp > 1:
            raise LayoutError(f"ParallelLayout.vpp={self.vpp} needs pp > 1, got pp=1")

    @property
    def etp(self) -> int:
        """Tensor-parallel size inside one expert (``expert_tp`` or ``tp``)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline stage (``vpp`` or 1)."""
        return 1 if self.vpp is None else self.vpp

    def validate_world(self, world_size: int) -> None:
        """Raise ``LayoutError`` unless this layout tiles ``world_size`` ranks."""
        if world_size % (self.tp * self.pp) != 0:
            raise LayoutError(
                f"world size {world_size} is not divisible by tp*pp = {self.tp}*{self.pp}; "
                f"allowed: a multiple of {self.tp * self.pp}"
            )
        stage_size = world_size // self.pp
        if stage_size % (self.etp * self.ep) != 0:
            raise LayoutError(
                f"ranks per pipeline stage ({stage_size}) are not divisible by expert_tp*ep = "
                f"{self.etp}*{self.ep}"
            )

    def data_parallel_size(self, world_size: int) -> int:
        """Number of replicas of the dense model (``W / (tp * pp)``)."""
        self.validate_world(world_size)
        return world_size // (self.tp * self.pp)

    def coords(self, rank: int, world_size: int) -> RankCoords:
        """The coordinates of ``rank`` in a world of ``world_size`` ranks."""
        self.validate_world(world_size)
        if not 0 <= rank < world_size:
            raise LayoutError(f"rank {rank} is outside [0, {world_size})")
        stage_size = world_size // self.pp
        local = rank % stage_size
        return RankCoords(
            rank=rank,
            tp_rank=local % self.tp,
            pp_rank=rank // stage_size,
            dp_rank=local // self.tp,
            ep_rank=(local // self.etp) % self.ep,
            etp_rank=local % self.etp,
        )


def layers_of_stage(num_layers: int, layout: ParallelLayout, pp_rank: int) -> list[int]:
    """Global indices of the decoder layers held by pipeline stage ``pp_rank``.

    With a virtual pipeline, chunk ``v`` of stage ``s`` holds layer block ``v * pp + s`` of
    ``pp * vpp`` equal blocks (Megatron's interleaved schedule).
    """
    blocks = layout.pp * layout.num_chunks
    if num_layers % blocks != 0:
        raise LayoutError(
            f"num_layers={num_layers} is not divisible by pp*vpp={blocks}; allowed: a multiple of {blocks}"
        )
    if not 0 <= pp_rank < layout.pp:
        raise LayoutError(f"pp_rank {pp_rank} is outside [0, {layout.pp})")
    per_block = num_layers // blocks
    layers: list[int] = []
    for chunk in range(layout.num_chunks):
        start = (chunk * layout.pp + pp_rank) * per_block
        layers.extend(range(start, start + per_block))
    return layers


def stage_of_layer(num_layers: int, layout: ParallelLayout, layer: int) -> int:
    """The pipeline stage holding global decoder layer ``layer``."""
    if not 0 <= layer < num_layers:
        raise LayoutError(f"layer {layer} is outside [0, {num_layers})")
    per_block = num_layers // (layout.pp * layout.num_chunks)
    return (layer // per_block) % layout.pp
