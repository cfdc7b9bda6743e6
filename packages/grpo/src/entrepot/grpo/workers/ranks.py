"""Where a worker sits: its rank and its data / tensor / pipeline parallel coordinates."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankInfo", "rank_layout"]


@dataclass(frozen=True)
class RankInfo:
    """Where a worker sits: its global rank and its data / tensor / pipeline parallel coordinates.

    Ranks are numbered as megatron-core numbers them (and `entrepot.resharding.ParallelLayout`):
    TP fastest, then DP, then PP; the ranks of one model-parallel group share a DP rank.
    """

    rank: int
    world_size: int
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one model replica (TP x PP); they read each batch once, through rank 0 of it."""
        return self.tp_size * self.pp_size

    @property
    def reads_dock(self) -> bool:
        """Whether this rank talks to the dock (first rank of its model-parallel group)."""
        return self.tp_rank == 0 and self.pp_rank == 0

    @property
    def group_source(self) -> int:
        """Global rank of this rank's model-parallel group leader (TP rank 0 of PP stage 0)."""
        return self.dp_rank * self.tp_size

    @property
    def name(self) -> str:
        if self.model_parallel_size == 1:
            return f"rank {self.rank}"
        return f"rank {self.rank} (dp {self.dp_rank}, tp {self.tp_rank}, pp {self.pp_rank})"


def rank_layout(dp_size: int, tp_size: int = 1, pp_size: int = 1) -> list[RankInfo]:
    """Every rank of a DP x TP x PP group, in megatron-core's order (TP fastest, PP slowest)."""
    from entrepot.resharding.layout import ParallelLayout

    world = dp_size * tp_size * pp_size
    layout = ParallelLayout(tp=tp_size, pp=pp_size)
    ranks = []
    for r in range(world):
        c = layout.coords(r, world)
        ranks.append(
            RankInfo(rank=r, world_size=world, dp_rank=c.dp_rank, dp_size=dp_size,
                     tp_rank=c.tp_rank, tp_size=tp_size, pp_rank=c.pp_rank, pp_size=pp_size)
        )  # fmt: skip
    return ranks
