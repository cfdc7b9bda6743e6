"""Worker side of the megatron-core tests: real ``GPTModel`` shards on 2 gloo CPU ranks.

Imported by module name in the spawned children (``mp.spawn`` pickles the function by
name). Each worker turns on the library's CPU mode (``enable_cpu_mode``, process-wide, which
is why only spawned children call it), builds its model with ``gpt_model_chunks`` and checks
it against HF.
"""

from __future__ import annotations

from typing import Any

import torch

from entrepot.resharding.engines.megatron_cpu import enable_cpu_mode
from entrepot.resharding.engines.megatron_model import gpt_model_chunks, transformer_config

WORLD = 2
TOKENS = (2, 12)  # [B, S] of the token batch every logits check feeds
ATOL = 1e-4  # max |megatron - HF| over this rank's logits (fp32)

_DENSE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6)  # fmt: skip
# Llama 3's frequency scaling with its released constants (megatron-core fixes all but the factor).
_LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8192)  # fmt: skip

# Tiny configs: vocab divisible by TP=2, 2 layers (one per stage at PP=2). A case id names the
# architecture (``hf_model`` reads the class from its part before any ``-``).
HF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "Qwen2ForCausalLM": ("Qwen2Config", dict(_DENSE, tie_word_embeddings=False)),
    "Qwen3ForCausalLM": (
        "Qwen3Config",
        dict(_DENSE, head_dim=32, tie_word_embeddings=False),  # head_dim != hidden / heads, as in Qwen3
    ),
    # initializer_range 0.1: rotations then move the logits enough (5e-3 for llama3 scaling at these
    # 12 positions, 1.8 for linear) that a RoPE built the default way fails ATOL
    "LlamaForCausalLM": (
        "LlamaConfig",
        dict(_DENSE, initializer_range=0.1, tie_word_embeddings=False, rope_parameters=_LLAMA3_ROPE),
    ),
    "LlamaForCausalLM-tied-linear": (
        "LlamaConfig",
        dict(
            _DENSE,
            initializer_range=0.1,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        ),
    ),
    "GPT2LMHeadModel": (
        "GPT2Config",
        dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32, tie_word_embeddings=True),
    ),
}

PARITY_CASES = ("GPT2LMHeadModel", "LlamaForCausalLM", "LlamaForCausalLM-tied-linear", "Qwen3ForCausalLM")
"""The cases ``check_parity`` runs in one world, each at TP=1 and TP=2."""


def init_parallel(rank: int, rendezvous: str, tp: int = 1, pp: int = 1, seed: int = 0) -> None:
    """CPU mode, a gloo process group and megatron-core's parallel state (+ its RNG tracker)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    assert enable_cpu_mode("cpu")
    if not dist.is_initialized():  # a file rendezvous: no port to race another process for
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)


def megatron_chunks(hf_config: Any, tp: int, pp: int) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks, built the library's way for the CPU mode."""
    config = transformer_config(
        hf_config, cpu=True, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    return gpt_model_chunks(hf_config, config)


def hf_model(case: str) -> Any:
    """A tiny random HF model of `case` (a key of ``HF_CONFIGS``); 1-D parameters (biases, norm
    weights) get noise so that they count."""
    import transformers

    config_class, kwargs = HF_CONFIGS[case]
    architecture = case.split("-")[0]
    config = getattr(transformers, config_class)(**kwargs)
    config.architectures = [architecture]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).float().eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param), alpha=0.1)
    return model


def _tokens(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq = TOKENS
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab_size, (batch, seq), generator=generator)  # [B, S]
    return tokens, torch.arange(seq).expand(batch, seq)  # positions [B, S]


def _load_hf_weights(hf: Any, engine: Any, layout: Any, rank: int) -> dict[str, torch.Tensor]:
    """Copy HF's weights into this rank's shard by global training name; returns the shard."""
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import copy_weights_in_place

    adaptor = get_adaptor(hf.config.architectures[0], hf.config)
    hf_state = {name: p.detach() for name, p in hf.named_parameters()}
    coords = layout.coords(rank, world_size=WORLD)
    shard = adaptor.shard(adaptor.hf_to_train(hf_state), layout, coords.tp_rank, coords.pp_rank)
    meta = engine.train_meta()
    assert meta == {n: (tuple(t.shape), t.dtype) for n, t in shard.items()}, (
        layout,
        sorted(set(meta) ^ set(shard)),
    )
    copy_weights_in_place(engine.named_train_parameters(), shard)
    return shard


def check_parity(rank: int, rendezvous: str, out: str) -> None:
    """Each of ``PARITY_CASES`` at TP=1 (DP=2) and TP=2, one case after another in this one world:
    HF weights loaded through ``hf_to_train`` + ``shard`` give HF's logits (at TP=2 this rank's vocab
    columns of them), and the shards gathered from both ranks come back through ``unshard`` +
    ``train_to_hf`` as the HF state dict, bit for bit.

    In the CPU mode (on here) ``from_pretrained`` of the saved model gives the model's buffers (RoPE's
    ``inv_freq``): the mode's patched tensor factories once left them uninitialised.

    Writes ``{"tp1": max diff, "tp2": max diff, "round_trip": [names that differ], "loaded_buffers":
    [buffers that differ]}`` (or the traceback, ``<rank>.error``) to `out`/<case>/<rank>.json, which
    the test of the case reads.
    """
    import json
    import traceback
    from pathlib import Path

    for case in PARITY_CASES:
        where = Path(out, case)
        where.mkdir(parents=True, exist_ok=True)
        try:
            result = {f"tp{tp}": _logits_diff(rank, rendezvous, case, tp) for tp in (1, 2)}
            result["round_trip"] = _round_trip_misses(rank, case)  # at TP=2, the last layout built
            # transformers saves on the global rank 0 only
            result["loaded_buffers"] = _buffers_after_loading(case, where / "hf") if rank == 0 else []
        except Exception:  # recorded for the case's test; the world stops (the ranks' collectives pair up)
            Path(where, f"{rank}.error").write_text(traceback.format_exc())
            raise
        Path(where, f"{rank}.json").write_text(json.dumps(result))


def _logits_diff(rank: int, rendezvous: str, case: str, tp: int) -> float:
    """max |megatron - HF| over this rank's logits of `case` at TP=`tp` (the model stays loaded)."""
    from entrepot.resharding import ParallelLayout
    from entrepot.resharding.engines.megatron import MegatronTrainingEngine

    init_parallel(rank, rendezvous, tp=tp)
    hf = hf_model(case)
    (model,) = megatron_chunks(hf.config, tp=tp, pp=1)
    engine = MegatronTrainingEngine(model)
    layout = ParallelLayout(tp=tp)
    assert engine.layout == layout, engine.layout
    _load_hf_weights(hf, engine, layout, rank)
    model.setup_embeddings_and_output_layer()
    tokens, positions = _tokens(hf.config.vocab_size)
    with torch.no_grad():
        logits = model(tokens, positions, attention_mask=None)  # [B, S, V / tp]
        columns = hf(input_ids=tokens).logits.chunk(tp, dim=-1)[layout.coords(rank, WORLD).tp_rank]
    assert logits.shape == columns.shape, (logits.shape, columns.shape)
    _LOADED[case] = (hf, engine, layout)
    return float((logits - columns).abs().max())


_LOADED: dict[str, tuple[Any, Any, Any]] = {}  # case -> (HF model, engine, layout) of its last build


def _buffers_after_loading(case: str, directory: Any) -> list[str]:
    """Save `case`'s HF model, load it back with ``from_pretrained``: the buffers that differ."""
    import transformers

    hf = hf_model(case)
    hf.save_pretrained(directory)
    loaded = getattr(transformers, hf.config.architectures[0]).from_pretrained(directory, dtype=torch.float32)
    ours, theirs = dict(hf.named_buffers()), dict(loaded.named_buffers())
    return [n for n in sorted(ours) if n not in theirs or not torch.equal(ours[n], theirs[n])]


def _round_trip_misses(rank: int, case: str) -> list[str]:
    """HF -> TP shards (in the GPTModel) -> HF: the names whose tensor differs from HF's (or is missing)."""
    import torch.distributed as dist

    from entrepot.resharding.adaptors import get_adaptor

    hf, engine, layout = _LOADED.pop(case)
    adaptor = get_adaptor(hf.config.architectures[0], hf.config)
    mine = {name: t.detach().clone() for name, t in engine.named_train_parameters().items()}
    shards: list[Any] = [None] * WORLD
    coords = layout.coords(rank, WORLD)
    dist.all_gather_object(shards, ((coords.tp_rank, coords.pp_rank), mine))
    back = adaptor.train_to_hf(adaptor.unshard(dict(shards), layout))
    state = {name: p.detach() for name, p in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:  # one tensor: training and the HF checkpoint keep the embedding
        state.pop("lm_head.weight")
    names = sorted(set(state) | set(back))
    return [n for n in names if n not in back or n not in state or not torch.equal(back[n], state[n])]


def check_tied_pipeline(rank: int, rendezvous: str) -> None:
    """GPT-2 (tied embeddings) at PP=2: the engine's shard is the adaptor's (the last stage's
    ``output_layer.weight``, a copy of the embeddings, is not listed), megatron re-syncs that copy
    from the loaded embeddings, and resharding to TP=1 gives the HF model's inference layout."""
    from entrepot.resharding import ParallelLayout, Resharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.megatron import MegatronTrainingEngine

    init_parallel(rank, rendezvous, pp=2)
    hf = hf_model("GPT2LMHeadModel")
    (model,) = megatron_chunks(hf.config, tp=1, pp=2)
    engine = MegatronTrainingEngine(model)
    layout = ParallelLayout(pp=2)
    assert engine.layout == layout, engine.layout
    names = dict(model.named_parameters())
    assert ("output_layer.weight" in names) == (rank == 1)  # the last stage holds the tied copy
    assert "output_layer.weight" not in engine.named_train_parameters()
    _load_hf_weights(hf, engine, layout, rank)  # asserts train_meta() == the adaptor's shard meta
    model.setup_embeddings_and_output_layer()  # the last stage's copy follows the loaded embeddings
    if rank == 1:
        assert torch.equal(names["output_layer.weight"], hf.transformer.wte.weight)
    adaptor = get_adaptor("GPT2LMHeadModel", hf.config)
    infer = Resharder(adaptor, layout, ParallelLayout(tp=1)).reshard(engine.named_train_parameters())
    reference = adaptor.hf_to_infer({name: p.detach() for name, p in hf.named_parameters()})
    assert sorted(infer) == sorted(reference)
    assert all(torch.equal(infer[n], reference[n]) for n in reference)


def check_gradient_clipping(rank: int, rendezvous: str) -> None:
    """The optimizer's ``clip_grad_by_total_norm_fp32`` scales CPU gradients by
    ``max_norm / (total_norm + 1e-6)`` when that is below 1, and leaves them alone otherwise."""
    import megatron.core.optimizer.optimizer as megatron_optimizer

    init_parallel(rank, rendezvous)
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]
    for param in params:
        param.grad = torch.full_like(param, 2.0)
    megatron_optimizer.clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=4.0)
    assert all(torch.allclose(p.grad, torch.full_like(p, 2.0 / (4.0 + 1e-6))) for p in params)
    megatron_optimizer.clip_grad_by_total_norm_fp32(params, max_norm=8.0, total_norm=4.0)
    assert all(torch.allclose(p.grad, torch.full_like(p, 2.0 / (4.0 + 1e-6))) for p in params)


def check_layouts(rank: int, rendezvous: str) -> None:
    """On 2 gloo ranks, for DP=2 (TP=1), TP=2 and PP=2 (Qwen2, untied): this rank's GPTModel shard
    has the global training names and shapes the adaptor cuts; loading HF weights by those names
    gives HF's logits (or this rank's vocab columns of them); resharding to TP=1 gives the
    inference layout of the HF model; an offload/onload cycle of params, grads and optimizer
    state restores every value."""
    import torch.distributed as dist

    from entrepot.resharding import Offloader, ParallelLayout, Resharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.megatron import MegatronTrainingEngine

    hf = hf_model("Qwen2ForCausalLM")
    adaptor = get_adaptor("Qwen2ForCausalLM", hf.config)
    reference = adaptor.hf_to_infer({name: p.detach() for name, p in hf.named_parameters()})
    for tp, pp in ((1, 1), (2, 1), (1, 2)):
        init_parallel(rank, rendezvous, tp=tp, pp=pp)
        layout = ParallelLayout(tp=tp, pp=pp)
        (model,) = megatron_chunks(hf.config, tp=tp, pp=pp)
        engine = MegatronTrainingEngine(model)
        assert engine.layout == layout, engine.layout
        _load_hf_weights(hf, engine, layout, rank)
        tokens, positions = _tokens(hf.config.vocab_size)
        if pp == 1:  # vocab-parallel logits of this rank equal HF's columns
            with torch.no_grad():
                logits = model(tokens, positions, attention_mask=None)
                columns = hf(input_ids=tokens).logits.chunk(tp, dim=-1)[layout.coords(rank, WORLD).tp_rank]
            torch.testing.assert_close(logits, columns, rtol=ATOL, atol=ATOL)
        infer = Resharder(adaptor, layout, ParallelLayout(tp=1)).reshard(engine.named_train_parameters())
        assert sorted(infer) == sorted(reference), layout
        assert all(torch.equal(infer[n], reference[n]) for n in reference), layout
        if pp == 1:  # a training step (the model's weights change) and an offload cycle
            _check_offload_cycle(model, engine, tokens, positions, Offloader)
        dist.barrier()


def _check_offload_cycle(model: Any, engine: Any, tokens: Any, positions: Any, offloader_cls: Any) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(tokens, positions, attention_mask=None).logsumexp(-1).mean().backward()
    optimizer.step()
    before = {n: t.clone() for n, t in engine.named_train_parameters().items()}
    offloader = offloader_cls(model, optimizer)
    offloader.offload_optimizer()
    offloader.offload_grads(keep=False)
    offloader.offload_params()
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    offloader.onload_params()
    offloader.onload_optimizer()
    offloader.onload_grads()
    after = engine.named_train_parameters()
    assert all(torch.equal(before[n], after[n]) for n in before)
