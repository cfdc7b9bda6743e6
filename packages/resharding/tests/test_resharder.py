"""Resharder: the transfer plan on many layouts in-process, and four gloo scenarios on 4 ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _reshard_workers as workers  # on sys.path through conftest.py, for the forked ranks
import pytest
import torch
import torch.multiprocessing as mp
import transformers

from entrepot.resharding import ChecksumMismatchError, LayoutError, ParallelLayout, Resharder, get_adaptor
from entrepot.resharding._plan import build_plan

WORLD = 4


def _tiny(architecture: str, **overrides: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    base: dict[str, Any] = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4)
    base.update(overrides)
    config = getattr(
        transformers, architecture.replace("ForCausalLM", "Config").replace("LMHeadModel", "Config")
    )(**base)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config)
    return config, {k: v.detach().clone() for k, v in model.state_dict().items()}


MODELS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "LlamaForCausalLM": dict(num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False),
    "GPT2LMHeadModel": dict(n_embd=32, n_layer=4, n_head=4, n_positions=16, vocab_size=64),
    "Qwen3MoeForCausalLM": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        tie_word_embeddings=False,
    ),
}


def _full_train(architecture: str, **overrides: Any) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    config, state = _tiny(architecture, **{**MODELS.get(architecture, {}), **overrides})
    adaptor = get_adaptor(architecture, config)
    return config, adaptor, adaptor.hf_to_train(state)


def _local(
    adaptor: Any, full: dict[str, torch.Tensor], layout: ParallelLayout, rank: int, world: int
) -> dict:
    c = layout.coords(rank, world)
    return adaptor.shard(full, layout, c.tp_rank, c.pp_rank, c.ep_rank, c.etp_rank)


def _simulate(plan: Any, locals_: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Execute a plan's segments in one process: every rank's assembled training-layout shard."""
    out = [
        {
            name: torch.full(shape, float("nan"), dtype=dtype)
            for name, (shape, dtype) in plan.needed(r).items()
        }
        for r in range(plan.world_size)
    ]
    for rnd in plan.rounds:
        for s in rnd.segments:
            src = locals_[s.src][s.name].narrow(s.dim, s.src_start, s.length)
            out[s.dst][s.name].narrow(s.dim, s.dst_start, s.length).copy_(src)
    return out


PLAN_CASES = [
    (8, ParallelLayout(tp=2, pp=2), ParallelLayout(tp=1)),
    (8, ParallelLayout(tp=2, pp=2), ParallelLayout(tp=8)),
    (8, ParallelLayout(tp=4, pp=2), ParallelLayout(tp=2, ep=4, expert_tp=1)),
    (8, ParallelLayout(tp=1, pp=4, vpp=2), ParallelLayout(tp=4, ep=2)),
    (8, ParallelLayout(tp=2, ep=4), ParallelLayout(tp=8, ep=8, expert_tp=1)),
    (8, ParallelLayout(tp=2, ep=2, expert_tp=1), ParallelLayout(tp=1, ep=8)),
    (4, ParallelLayout(tp=4), ParallelLayout(tp=2, ep=2)),
    (2, ParallelLayout(pp=2), ParallelLayout(tp=2, ep=2, expert_tp=1)),
]


@pytest.mark.parametrize(("world", "train", "infer"), PLAN_CASES)
def test_plan_assembles_exactly_the_inference_shard_of_every_rank(
    world: int, train: ParallelLayout, infer: ParallelLayout
) -> None:
    _, adaptor, full = _full_train(
        "Qwen3MoeForCausalLM",
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=4,
        num_experts=8,
        num_hidden_layers=8,
    )
    locals_ = [_local(adaptor, full, train, r, world) for r in range(world)]
    metas = [{n: (tuple(t.shape), t.dtype) for n, t in local.items()} for local in locals_]
    plan = build_plan(adaptor, metas, train, infer, bucket_bytes=8192)
    assert len(plan.rounds) > 1
    for rank, got in enumerate(_simulate(plan, locals_)):
        c = infer.coords(rank, world)
        expected = adaptor.shard(full, infer, c.tp_rank, 0, c.ep_rank, c.etp_rank)
        assert sorted(got) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), (rank, name)
    # Rounds that hold more than one unit (a staged group or a renamed slice) stay within the bucket.
    for rnd in plan.rounds:
        renamed = [s for s in rnd.segments if not plan.params[s.name].staged]
        if len(rnd.staged_groups) + len(renamed) > 1:
            for rank in range(world):
                regions, size = plan.scratch_layout(rnd, rank)
                assert size <= 8192 + 256 * len(regions)
    # Each destination element is written exactly once: segment bytes == assembled bytes.
    for rank in range(world):
        written = sum(s.nbytes for r in plan.rounds for s in r.segments if s.dst == rank)
        assert written == sum(
            torch.Size(shape).numel() * dt.itemsize for shape, dt in plan.needed(rank).values()
        )


def test_plan_for_mla_and_shared_experts_then_conversion_per_rank() -> None:
    """DeepSeek-V3: replicated MLA down projections, TP-split up projections, routed + shared experts."""
    world, train, infer = 4, ParallelLayout(tp=2, pp=2), ParallelLayout(tp=2, ep=2, expert_tp=1)
    _, adaptor, full = _full_train("DeepseekV3ForCausalLM", **DEEPSEEK)
    locals_ = [_local(adaptor, full, train, r, world) for r in range(world)]
    metas = [{n: (tuple(t.shape), t.dtype) for n, t in local.items()} for local in locals_]
    plan = build_plan(adaptor, metas, train, infer, bucket_bytes=4096)
    for rank, got in enumerate(_simulate(plan, locals_)):
        c = infer.coords(rank, world)
        expected = adaptor.train_to_infer(adaptor.shard(full, infer, c.tp_rank, 0, c.ep_rank, c.etp_rank))
        converted = adaptor.train_to_infer(got)
        assert sorted(converted) == sorted(expected)
        assert all(torch.equal(converted[n], t) for n, t in expected.items())
        assert converted["model.layers.1.mlp.experts.w13_weight"].shape[0] == 2  # 4 experts over ep=2


def test_plan_rejects_missing_pieces_and_bad_layouts() -> None:
    _, adaptor, full = _full_train("LlamaForCausalLM")
    train = ParallelLayout(tp=2)
    locals_ = [_local(adaptor, full, train, r, 2) for r in range(2)]
    metas = [{n: (tuple(t.shape), t.dtype) for n, t in local.items()} for local in locals_]
    metas[1].pop("decoder.layers.0.self_attention.linear_qkv.weight")
    with pytest.raises(LayoutError, match="linear_qkv"):
        build_plan(adaptor, metas, train, ParallelLayout(tp=1), 1 << 20)
    with pytest.raises(LayoutError, match="pp=1"):
        Resharder(adaptor, train, ParallelLayout(tp=1, pp=2))
    with pytest.raises(LayoutError, match="divisible"):
        build_plan(adaptor, metas[:1] * 3, train, ParallelLayout(tp=1), 1 << 20)


def test_single_process_reshard_without_a_process_group() -> None:
    _, adaptor, full = _full_train("Qwen2ForCausalLM")
    resharder = Resharder(adaptor, ParallelLayout(), ParallelLayout(), verify=True)
    got = resharder.reshard(full)
    expected = adaptor.train_to_infer(full)
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[n], t) for n, t in expected.items())
    assert resharder.stats.num_collectives == 0
    assert resharder.stats.bytes_local == sum(t.numel() * t.element_size() for t in full.values())


SCENARIOS = {
    "tp2pp2-to-tp1": ("Qwen2ForCausalLM", ParallelLayout(tp=2, pp=2), ParallelLayout(tp=1), 4096, True),
    "tp2pp2-to-tp1-over-gloo": (
        "Qwen2ForCausalLM",
        ParallelLayout(tp=2, pp=2),
        ParallelLayout(tp=1),
        4096,
        True,
    ),
    "tp1pp2-to-tp2": (
        "GPT2LMHeadModel",
        ParallelLayout(tp=1, pp=2, vpp=2),
        ParallelLayout(tp=2),
        1 << 30,
        False,
    ),
    "tp2-to-tp4": ("LlamaForCausalLM", ParallelLayout(tp=2), ParallelLayout(tp=4), 1 << 30, False),
    "ep2-to-ep4": (
        "Qwen3MoeForCausalLM",
        ParallelLayout(tp=2, ep=2),
        ParallelLayout(tp=1, ep=4),
        16384,
        False,
    ),
}


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gloo_reshard_matches_the_shard_cut_from_the_full_model(scenario: str, tmp_path: Path) -> None:
    architecture, train, infer, bucket_bytes, corrupt_check = SCENARIOS[scenario]
    config, state = _tiny(architecture, **MODELS[architecture])
    state_path = tmp_path / "state.pt"
    torch.save(state, state_path)
    job = workers.Scenario(
        architecture,
        config.to_dict(),
        str(state_path),
        train,
        infer,
        bucket_bytes,
        corrupt_check,
        shared_memory=not scenario.endswith("-over-gloo"),
    )
    rendezvous = str(tmp_path / "gloo.rendezvous")  # a file: no port to race another process for
    mp.start_processes(workers.run, args=(WORLD, rendezvous, job), nprocs=WORLD, start_method="forkserver")


OLD_PERIOD = 65_521  # the old checksum's weights were position % 65521 + 1


def _swap_pairs(seed: int, num_elements: int) -> list[tuple[int, int]]:
    """Three random pairs, each at a random multiple (1-5) of the old period."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(3):
        distance = OLD_PERIOD * int(torch.randint(1, 6, (1,), generator=generator))
        first = int(torch.randint(0, num_elements - distance, (1,), generator=generator))
        pairs.append((first, first + distance))
    return pairs


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
def test_swapped_elements_inside_a_received_slice_are_caught(tmp_path: Path) -> None:
    """On 2 gloo ranks, rank 1 swaps elements of the embedding it received (524,288 elements):
    (a) two elements one old period apart, (b) three random pairs at random multiples of it.
    Every rank must raise ChecksumMismatchError naming the embedding."""
    config, state = _tiny("Qwen2ForCausalLM", **{**MODELS["Qwen2ForCausalLM"], "vocab_size": 16384})
    state_path = tmp_path / "state.pt"
    torch.save(state, state_path)
    probes = [[(1000, 1000 + OLD_PERIOD)]] + [_swap_pairs(seed, 16384 * 32) for seed in range(4)]
    job = workers.SwapProbes("Qwen2ForCausalLM", config.to_dict(), str(state_path), probes)
    rendezvous = str(tmp_path / "gloo.rendezvous")
    mp.start_processes(
        workers.run_swap_probes, args=(2, rendezvous, job), nprocs=2, start_method="forkserver"
    )


def _swap_rows(tensor: torch.Tensor, a: slice, b: slice) -> torch.Tensor:
    out = tensor.clone()
    out[a], out[b] = tensor[b], tensor[a]
    return out


WRONG_CONVERSIONS: dict[str, tuple[str, str, Any]] = {
    # name: (architecture, the parameter named in the error, wrong edit of the inference tensors)
    "qkv rows permuted": (
        "Qwen2ForCausalLM",
        "decoder.layers.1.self_attention.linear_qkv.weight",
        lambda name, t: (
            t[torch.randperm(t.shape[0], generator=torch.Generator().manual_seed(0))]
            if name == "model.layers.1.self_attn.qkv_proj.weight"
            else t
        ),
    ),
    "two query heads swapped": (
        "LlamaForCausalLM",
        "decoder.layers.2.self_attention.linear_qkv.weight",
        lambda name, t: (
            _swap_rows(t, slice(0, 4), slice(4, 8))  # head_dim 4
            if name == "model.layers.2.self_attn.qkv_proj.weight"
            else t
        ),
    ),
    "experts stacked in reverse": (
        "Qwen3MoeForCausalLM",
        "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
        lambda name, t: t.flip(0) if name == "model.layers.0.mlp.experts.w13_weight" else t,
    ),
    "MLA split one row late": (
        "DeepseekV3ForCausalLM",
        "decoder.layers.0.self_attention.linear_qkv.weight",
        lambda name, t: (
            _swap_rows(t, slice(-1, None), slice(-2, -1))
            if name == "model.layers.0.self_attn.q_a_proj.weight"
            else t
        ),
    ),
}

DEEPSEEK = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    first_k_dense_replace=1,
    q_lora_rank=12,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=2,
    v_head_dim=4,
    n_group=1,
    topk_group=1,
    tie_word_embeddings=False,
)


@pytest.mark.parametrize("architecture", [*MODELS, "DeepseekV3ForCausalLM"])
def test_verify_passes_on_a_correct_reshard_of_every_adaptor(architecture: str) -> None:
    overrides = DEEPSEEK if architecture.startswith("Deepseek") else {}
    _, adaptor, full = _full_train(architecture, **overrides)
    got = Resharder(adaptor, ParallelLayout(), ParallelLayout(), verify=True).reshard(full)
    expected = adaptor.train_to_infer(full)
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[n], t) for n, t in expected.items())


@pytest.mark.parametrize("wrong", list(WRONG_CONVERSIONS))
def test_a_wrong_layout_conversion_is_caught_and_named(wrong: str) -> None:
    architecture, parameter, edit = WRONG_CONVERSIONS[wrong]
    config, adaptor, full = _full_train(
        architecture, **(DEEPSEEK if architecture.startswith("Deepseek") else {})
    )

    class WrongAdaptor(type(adaptor)):  # type: ignore[misc]
        def train_to_infer(self, state: Any) -> dict[str, torch.Tensor]:
            return {n: edit(n, t) for n, t in super().train_to_infer(state).items()}

    resharder = Resharder(WrongAdaptor(config), ParallelLayout(), ParallelLayout(), verify=True)
    with pytest.raises(ChecksumMismatchError, match="layout conversion") as caught:
        resharder.reshard(full)
    assert f"rank 0: {parameter!r} differs" in str(caught.value)
    assert "0 slice(s)" in str(caught.value)
