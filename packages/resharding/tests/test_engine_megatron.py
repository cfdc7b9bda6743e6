"""megatron-core adapter against real GPTModels on CPU: the library's CPU mode, gloo, 2 spawned ranks.

The CPU mode patches torch process-wide, so every check that turns it on runs in spawned
workers (``tests/support/megatron_workers.py``); the tests in this process only check the
cases where it must patch nothing.
"""

from __future__ import annotations

import importlib.metadata
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from entrepot.resharding import EngineError, MissingExtraError
from entrepot.resharding.engines import megatron_cpu
from entrepot.resharding.engines.megatron import global_train_name

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

import megatron_workers  # on sys.path through conftest.py, for the forked ranks


def _run_ranks(check: Callable[..., None], *args: object) -> None:
    """``check(rank, rendezvous, *args)`` on 2 ranks forked from the package's forkserver (conftest.py);
    they meet through the file `rendezvous`."""
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = str(Path(folder) / "gloo.rendezvous")
        mp.start_processes(
            check, args=(rendezvous, *args), nprocs=megatron_workers.WORLD, start_method="forkserver"
        )


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
def test_gpt_model_shards_in_training_layout_on_dp2_tp2_pp2() -> None:
    """Real GPTModel on 2 gloo ranks; the checks (see ``check_layouts``) run in the workers."""
    _run_ranks(megatron_workers.check_layouts)


@pytest.fixture(scope="module")
def parity_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank world that runs every case of ``megatron_workers.PARITY_CASES`` (TP=1, TP=2, the
    round trip), one after another: megatron parity cases share one world. Each writes
    ``<case>/<rank>.json``, which its test reads."""
    out = tmp_path_factory.mktemp("megatron-parity")
    try:
        _run_ranks(megatron_workers.check_parity, str(out))
    except Exception as error:  # a failed case: its test reports it (`<rank>.error`), the later ones this
        (out / "world.error").write_text(f"the parity world stopped: {error}")
    return out


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
@pytest.mark.parametrize("case", megatron_workers.PARITY_CASES)
def test_gpt_model_chunks_give_hf_logits_and_round_trip_bit_exactly(case: str, parity_world: Path) -> None:
    """GPT-2 (tied, learned positions, LayerNorm, biases), Llama (GQA, untied, llama3 RoPE scaling;
    tied with linear scaling) and Qwen3 (per-head q/k RMSNorm, head_dim != hidden / heads): megatron's
    logits equal HF's within 1e-4 at TP=1 and TP=2, HF -> TP=2 shards -> HF is bit-exact, and
    ``from_pretrained`` in the CPU mode restores the model's buffers (RoPE's ``inv_freq``)."""
    folder = parity_world / case
    errors = [p.read_text() for p in sorted(folder.glob("*.error"))]
    assert not errors, errors[0]
    stopped = parity_world / "world.error"
    files = [folder / f"{rank}.json" for rank in range(megatron_workers.WORLD)]
    assert all(f.is_file() for f in files), stopped.read_text() if stopped.is_file() else folder
    for rank, result in enumerate(json.loads(f.read_text()) for f in files):
        for tp in ("tp1", "tp2"):
            assert result[tp] <= megatron_workers.ATOL, (case, rank, tp, result)
        assert result["round_trip"] == [], (case, rank, result["round_trip"])
        assert result["loaded_buffers"] == [], (
            case,
            rank,
            result["loaded_buffers"],
        )  # from_pretrained in CPU mode


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
def test_tied_embeddings_at_pp2_are_listed_once() -> None:
    """GPT-2 at PP=2: ``train_meta()`` equals the adaptor's shard meta (no ``output_layer.weight``)."""
    _run_ranks(megatron_workers.check_tied_pipeline)


@pytest.mark.integration  # ranks forked from the forkserver, a gloo world
def test_cpu_mode_clips_gradients_like_megatron() -> None:
    """megatron's clipping asserts CUDA gradients; in the CPU mode the same scaling runs on CPU."""
    _run_ranks(megatron_workers.check_gradient_clipping)


def _patched_attributes() -> dict[str, object]:
    """Everything the CPU mode may replace, by name (compared by identity)."""
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as megatron_optimizer
    import megatron.core.tensor_parallel.random as megatron_random

    attributes: dict[str, object] = {
        f"torch.cuda.{name}": getattr(torch.cuda, name)
        for name in ("current_device", "synchronize", "manual_seed", "manual_seed_all", "get_rng_state",
                     "set_rng_state")
    }  # fmt: skip
    attributes["torch.cuda.random.get_rng_state"] = torch.cuda.random.get_rng_state
    attributes["torch.Tensor.cuda"] = torch.Tensor.cuda
    attributes |= {f"torch.{name}": getattr(torch, name) for name in megatron_cpu._FACTORIES}
    for name in ("_get_cuda_rng_state", "_set_cuda_rng_state"):
        attributes[f"megatron_random.{name}"] = getattr(megatron_random, name)
    for module in (clip_grads, megatron_optimizer):
        attributes[f"{module.__name__}.clip_grad_by_total_norm_fp32"] = module.clip_grad_by_total_norm_fp32
    return attributes


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """This process without the CPU mode, guarded: a patch attempt fails the test instead of patching."""

    def refuse() -> None:
        raise AssertionError("the CPU mode tried to patch the test process")

    monkeypatch.delattr(torch.cuda, megatron_cpu._ENABLED_FLAG, raising=False)
    for name in dir(megatron_cpu):
        if name.startswith("_patch_"):
            monkeypatch.setattr(megatron_cpu, name, refuse)
    return _patched_attributes()


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_cpu_mode_leaves_a_gpu_run_untouched(unpatched: dict[str, object], device: object) -> None:
    assert megatron_cpu.enable_cpu_mode(device) is False  # type: ignore[arg-type]
    after = _patched_attributes()
    assert all(after[name] is value for name, value in unpatched.items())
    assert not hasattr(torch.cuda, megatron_cpu._ENABLED_FLAG)


def test_cpu_mode_refuses_another_megatron_release(
    unpatched: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_version = importlib.metadata.version
    for version in ("0.15.3", "0.17.0", "1.16.0"):
        monkeypatch.setattr(
            importlib.metadata,
            "version",
            lambda dist, v=version: v if dist == "megatron-core" else real_version(dist),
        )
        assert megatron_cpu.megatron_version() == version
        with pytest.raises(EngineError, match=rf"supports megatron-core 0\.16\.x, found {version}"):
            megatron_cpu.enable_cpu_mode("cpu")
    assert all(_patched_attributes()[name] is value for name, value in unpatched.items())


def test_cpu_mode_names_what_is_missing_or_in_the_way(
    unpatched: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(megatron_cpu, "megatron_version", lambda: "0.16.1")
        patch.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises(EngineError, match="but CUDA is available"):
            megatron_cpu.enable_cpu_mode("cpu")

    def not_installed(dist: str) -> str:
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(MissingExtraError, match=r"\./packages/resharding\[megatron\]"):
        megatron_cpu.enable_cpu_mode("cpu")
    assert all(_patched_attributes()[name] is value for name, value in unpatched.items())


def test_global_names_from_local_layers_experts_and_te_modules() -> None:
    layers, experts = [4, 5], [6, 7]
    assert global_train_name("decoder.layers.1.mlp.linear_fc2.weight", layers, []) == (
        "decoder.layers.5.mlp.linear_fc2.weight"
    )
    assert global_train_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", layers, []) == (
        "decoder.layers.4.input_layernorm.weight"
    )
    assert global_train_name("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", layers, []) == (
        "decoder.layers.5.pre_mlp_layernorm.weight"
    )
    assert global_train_name(
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight", layers, experts
    ) == ("decoder.layers.4.mlp.experts.local_experts.7.linear_fc1.weight")
    assert global_train_name("decoder.layers.1.mlp.experts.linear_fc2.weight0", layers, experts) == (
        "decoder.layers.5.mlp.experts.local_experts.6.linear_fc2.weight"
    )
    assert (
        global_train_name("embedding.word_embeddings.weight", layers, experts)
        == "embedding.word_embeddings.weight"
    )
    with pytest.raises(EngineError, match="local layer 2 but the chunk has 2 layers"):
        global_train_name("decoder.layers.2.input_layernorm.weight", layers, [])
    with pytest.raises(EngineError, match="local expert 3 but this rank has 2 experts"):
        global_train_name("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight", layers, experts)
