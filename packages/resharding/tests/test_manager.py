"""ShardingManager over a real tiny HF GPT-2: modes, staged offload, weights reach inference."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from entrepot.resharding import (
    INFERENCE_TAGS,
    InferenceEngine,
    LocalResharder,
    ModeTransitionError,
    Offloader,
    ShardingManager,
    TrainingEngine,
)
from entrepot.resharding.adaptors import get_adaptor
from entrepot.resharding.engines import TorchInferenceEngine, TorchTrainingEngine
from entrepot.resharding.errors import EngineError


def _gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    return GPT2LMHeadModel(config).eval()


def _train_step(model: GPT2LMHeadModel, optimizer: torch.optim.Optimizer) -> None:
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(7))
    optimizer.zero_grad(set_to_none=False)
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()


def _greedy(model: GPT2LMHeadModel) -> torch.Tensor:
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)


@pytest.fixture
def setup() -> tuple[ShardingManager, GPT2LMHeadModel, torch.optim.Optimizer, GPT2LMHeadModel]:
    model = _gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train_step(model, optimizer)  # optimizer state and grads exist
    generator_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in generator_model.parameters():
            p.zero_()  # the inference copy starts stale: only resharding can make it right
    adaptor = get_adaptor("GPT2LMHeadModel", model.config)
    manager = ShardingManager(
        TorchTrainingEngine(model, adaptor),
        TorchInferenceEngine(generator_model),
        LocalResharder(adaptor, target="hf"),
        Offloader(model, optimizer),
    )
    return manager, model, optimizer, generator_model


def test_engines_satisfy_the_protocols() -> None:
    model = _gpt2()
    engine = TorchTrainingEngine(model, get_adaptor("GPT2LMHeadModel", model.config))
    assert isinstance(engine, TrainingEngine)
    assert isinstance(TorchInferenceEngine(model), InferenceEngine)


def test_enter_infer_reshards_then_offloads_training_params(setup) -> None:  # type: ignore[no-untyped-def]
    manager, model, _, generator_model = setup
    trained = {name: p.detach().clone() for name, p in model.named_parameters()}

    record = manager.enter_infer_mode()

    # GPT-2's HF names map onto the training names one to one, so the LocalResharder hands
    # over views of the training params: those are offloaded only once the copy is loaded.
    assert record.stages == ("reshard", "onload_weights", "load_weights", "offload_params", "onload_kv_cache")
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    for name, param in generator_model.named_parameters():
        assert torch.equal(param, trained[name]), name
    manager.exit_infer_mode()
    assert all(p.untyped_storage().nbytes() == 0 for p in generator_model.parameters())
    manager.enter_forward_mode()
    for name, param in model.named_parameters():
        assert torch.equal(param, trained[name]), name


def test_inference_copy_follows_training(setup) -> None:  # type: ignore[no-untyped-def]
    manager, model, optimizer, generator_model = setup
    for _ in range(2):
        with manager.mode("infer"):
            generated = _greedy(generator_model)
        with manager.mode("forward"):
            assert torch.equal(generated, _greedy(model))
        with manager.mode("train"):
            _train_step(model, optimizer)
        # outside train mode optimizer state and (dropped) grads hold no device memory
        assert manager.offloader is not None
        assert manager.offloader.is_offloaded("optimizer") and manager.offloader.is_offloaded("grads")

    names = [record.name for record in manager.history]
    assert names[:6] == [
        "enter_infer_mode",
        "exit_infer_mode",
        "enter_forward_mode",
        "exit_forward_mode",
        "enter_train_mode",
        "exit_train_mode",
    ]
    assert all(r.seconds >= 0 and r.memory_source == "tracked" for r in manager.history)


def test_staged_offload_keeps_peak_below_everything_resident(setup) -> None:  # type: ignore[no-untyped-def]
    manager, model, _, _ = setup
    everything = manager.offloader.resident_bytes()  # type: ignore[union-attr]
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    manager.enter_train_mode()
    manager.exit_train_mode()
    record = manager.enter_infer_mode()
    # at the peak the training params and the inference copy, never with optimizer state
    assert 2 * params <= record.peak_bytes < everything + params
    assert record.resident_bytes == params  # only the inference copy is left
    manager.exit_infer_mode()
    train = manager.enter_train_mode()
    assert train.stages == ("onload_params", "onload_optimizer", "onload_grads")
    assert train.resident_bytes == everything


def test_mode_errors_name_the_current_mode(setup) -> None:  # type: ignore[no-untyped-def]
    manager, *_ = setup
    with pytest.raises(ModeTransitionError, match="while in 'idle' mode"):
        manager.exit_train_mode()
    manager.enter_forward_mode()
    with pytest.raises(ModeTransitionError, match="cannot enter infer mode while in 'forward'"):
        manager.enter_infer_mode()
    with pytest.raises(ModeTransitionError, match="unknown mode 'generate'"), manager.mode("generate"):
        pass


def test_offload_flags_need_an_offloader() -> None:
    model = _gpt2()
    adaptor = get_adaptor("GPT2LMHeadModel", model.config)
    with pytest.raises(ModeTransitionError, match="offload_train_params, offload_grads, offload_optimizer"):
        ShardingManager(
            TorchTrainingEngine(model, adaptor), TorchInferenceEngine(_gpt2()), LocalResharder(adaptor)
        )


def test_torch_inference_engine_validates_before_copying() -> None:
    engine = TorchInferenceEngine(_gpt2())
    weights = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    before = engine.module.transformer.wte.weight.detach().clone()
    with pytest.raises(EngineError, match="unknown weight names"):
        engine.load_weights({**weights, "transformer.extra.weight": torch.zeros(1)})
    bad = {**weights, "transformer.wte.weight": torch.ones(3, 3)}
    with pytest.raises(EngineError, match=r"shape \(3, 3\)"):
        engine.load_weights(bad)
    assert torch.equal(engine.module.transformer.wte.weight, before)
    with pytest.raises(EngineError, match="unknown onload tags"):
        engine.onload(("optimizer",))
    assert set(INFERENCE_TAGS) == {"weights", "kv_cache"}


def test_a_bare_adaptor_becomes_a_local_resharder() -> None:
    model = _gpt2()
    adaptor = get_adaptor("GPT2LMHeadModel", model.config)
    manager = ShardingManager(
        TorchTrainingEngine(model, adaptor), TorchInferenceEngine(_gpt2()), adaptor, Offloader(model)
    )
    assert isinstance(manager.resharder, LocalResharder) and manager.resharder.target == "infer"
    weights = manager.resharder.reshard(manager.train_engine.named_train_parameters())
    assert weights.keys() == adaptor.hf_to_infer(dict(model.named_parameters())).keys()


def test_an_engine_over_a_model_loaded_from_safetensors_offloads_and_reloads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``from_pretrained`` maps the safetensors file (storages that cannot be resized): the engine
    takes its weights into process memory, so offloading them frees them; the tied head stays tied."""
    source = _gpt2()
    source.save_pretrained(tmp_path)
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert not loaded.transformer.wte.weight.untyped_storage().resizable()  # what the engine must handle
    engine = TorchInferenceEngine(loaded)
    engine.offload()
    assert engine.resident_bytes() == 0
    engine.onload(("weights",))
    engine.load_weights({name: p.detach() for name, p in source.named_parameters()})
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert torch.equal(_greedy(loaded), _greedy(source))
