"""Worker side of the multi-process resharding tests (imported by module name in spawned children).

Every rank loads the same full HF state dict, cuts its training shard with
``WeightAdaptor.shard``, reshards with gloo, and compares its result bit for bit with the
inference shard cut directly from the full model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from entrepot.resharding import ChecksumMismatchError, ParallelLayout, Resharder, get_adaptor
from entrepot.resharding._shared import SHM_DIR
from entrepot.resharding.adaptors import LlamaAdaptor


@dataclass(frozen=True)
class Scenario:
    """One multi-process test: a model, two layouts and a bucket size."""

    architecture: str
    config: dict[str, Any]
    state_path: str
    train: ParallelLayout
    infer: ParallelLayout
    bucket_bytes: int
    corrupt_check: bool = False
    shared_memory: bool = True  # False: through gloo's sockets (what ranks on two hosts do)


class CorruptingResharder(Resharder):
    """Flips one byte of the first slice rank 1 received: checksum verification must catch it."""

    corrupted = False

    def _landed(self, rnd: Any, rank: int, targets: Mapping[str, torch.Tensor]) -> None:
        for seg in rnd.segments:
            if rank != 1 or self.corrupted or seg.dst != rank or seg.src == rank:
                continue
            region = targets[seg.name].narrow(seg.dim, seg.dst_start, seg.length)
            if region.is_contiguous() and region.numel():
                flat = region.view(-1).view(torch.uint8)
                flat[flat.numel() // 2] ^= 0x40
                self.corrupted = True


@dataclass(frozen=True)
class SwapProbes:
    """Reshards of one model (training PP=2 -> inference TP=1 on 2 ranks), each with swapped pairs."""

    architecture: str
    config: dict[str, Any]
    state_path: str
    probes: list[list[tuple[int, int]]]  # per reshard: the (i, k) flat positions swapped on rank 1


class SwappingResharder(Resharder):
    """Rank 1 swaps pairs of elements inside the first slice it receives, after it arrived."""

    def __init__(self, *args: Any, pairs: list[tuple[int, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pairs = pairs
        self.swapped: str | None = None

    def _landed(self, rnd: Any, rank: int, targets: Mapping[str, torch.Tensor]) -> None:
        for seg in rnd.segments:
            if rank != 1 or self.swapped is not None or seg.dst != rank or seg.src == rank:
                continue
            region = targets[seg.name].narrow(seg.dim, seg.dst_start, seg.length)
            if region.is_contiguous() and region.numel() > max(k for _, k in self.pairs):
                flat = region.view(-1)
                for i, k in self.pairs:
                    assert flat[i] != flat[k], (i, k)  # a swap of equal values changes nothing
                    flat[i], flat[k] = flat[k].clone(), flat[i].clone()
                self.swapped = seg.name


def run_swap_probes(rank: int, world: int, rendezvous: str, job: SwapProbes) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        adaptor = get_adaptor(job.architecture, SimpleNamespace(**job.config))
        full = adaptor.hf_to_train(torch.load(job.state_path))
        train = ParallelLayout(pp=2)
        local = adaptor.shard(full, train, pp_rank=train.coords(rank, world).pp_rank)
        for pairs in job.probes:
            resharder = SwappingResharder(adaptor, train, ParallelLayout(), verify=True, pairs=pairs)
            try:
                resharder.reshard(local)
            except ChecksumMismatchError as err:
                assert "'embedding.word_embeddings.weight' rank 0 -> rank 1" in str(err), str(err)
                assert "1 slice(s)" in str(err), str(err)
            else:
                raise AssertionError(f"rank {rank}: swaps {pairs} were not detected")
            assert rank != 1 or resharder.swapped == "embedding.word_embeddings.weight", resharder.swapped
    finally:
        dist.destroy_process_group()


class RankOneSwapsHeads(LlamaAdaptor):
    """A wrong conversion on rank 1 only: the first two query heads of layer 0 trade places."""

    def train_to_infer(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = super().train_to_infer(state)
        qkv = out.get("model.layers.0.self_attn.qkv_proj.weight")
        if dist.get_rank() == 1 and qkv is not None:
            rows = self.dims.head_dim
            out["model.layers.0.self_attn.qkv_proj.weight"] = torch.cat(
                [qkv[rows : 2 * rows], qkv[:rows], qkv[2 * rows :]]
            )
        return out


def run(rank: int, world: int, rendezvous: str, scenario: Scenario) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        _check(rank, world, scenario)
    finally:
        dist.destroy_process_group()


def _check(rank: int, world: int, sc: Scenario) -> None:
    adaptor = get_adaptor(sc.architecture, SimpleNamespace(**sc.config))
    full = adaptor.hf_to_train(torch.load(sc.state_path))
    tc = sc.train.coords(rank, world)
    local = adaptor.shard(full, sc.train, tc.tp_rank, tc.pp_rank, tc.ep_rank, tc.etp_rank)
    ic = sc.infer.coords(rank, world)
    expected = adaptor.train_to_infer(adaptor.shard(full, sc.infer, ic.tp_rank, 0, ic.ep_rank, ic.etp_rank))

    options = dict(bucket_bytes=sc.bucket_bytes, verify=True, shared_memory=sc.shared_memory)
    resharder = Resharder(adaptor, sc.train, sc.infer, **options)  # type: ignore[arg-type]
    for _ in range(2):  # the second pass re-uses the plan and rebuilds the destroyed buffers
        got = resharder.reshard(local)
        assert sorted(got) == sorted(expected), f"rank {rank}: names {sorted(set(got) ^ set(expected))}"
        for name, tensor in expected.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (
                f"rank {rank}: {name} differs"
            )
        resharder.destroy_buffers()
        assert all(t.numel() == 0 for t in got.values())
        assert resharder.stats.transport == ("shared_memory" if sc.shared_memory else "group")
    assert not [f for f in os.listdir(SHM_DIR) if f.startswith(f"entrepot-reshard-{resharder._token}")]
    stats = resharder.stats
    # One all-to-all per dtype per round, never one per tensor: a single round for large buckets.
    num_dtypes = len({t.dtype for t in full.values()})
    assert stats.num_collectives <= stats.num_rounds * num_dtypes, f"rank {rank}: {stats}"
    if sc.bucket_bytes >= sum(t.numel() * t.element_size() for t in full.values()):
        assert stats.num_rounds == 1 and stats.num_collectives == num_dtypes, f"rank {rank}: {stats}"
    assert stats.bytes_received + stats.bytes_local >= sum(
        t.numel() * t.element_size() for t in expected.values()
    )

    if sc.corrupt_check:
        corrupt = CorruptingResharder(adaptor, sc.train, sc.infer, **options)  # type: ignore[arg-type]
        try:
            corrupt.reshard(local)
        except ChecksumMismatchError as err:
            assert "rank" in str(err)
        else:
            raise AssertionError(f"rank {rank}: corrupted transfer was not detected")
        wrong = RankOneSwapsHeads(SimpleNamespace(**sc.config))
        try:
            Resharder(wrong, sc.train, sc.infer, **options).reshard(local)  # type: ignore[arg-type]
        except ChecksumMismatchError as err:  # every rank hears of rank 1's conversion, by name
            assert "rank 1: 'decoder.layers.0.self_attention.linear_qkv.weight' differs" in str(err), str(err)
        else:
            raise AssertionError(f"rank {rank}: a wrong conversion on rank 1 was not detected")
