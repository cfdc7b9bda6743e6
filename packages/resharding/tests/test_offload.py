"""Offloader: storages emptied on offload, restored bit-identically, training unaffected."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from entrepot.resharding import Offloader, OffloadStateError


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 11))
    model[3].weight = model[0].weight  # tied embedding: one storage, two parameters
    return model


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 11, (4, 5), generator=generator).to(next(model.parameters()).device)
    optimizer.zero_grad(set_to_none=False)
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    optimizer.step()
    return loss.detach()


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    tensors += [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer, seed=1)
    return model, optimizer


def test_offload_empties_device_storages_and_onload_restores_bits() -> None:
    model, optimizer = _trained()
    before = _snapshot(model, optimizer)
    offloader = Offloader(model, optimizer)
    resident = offloader.resident_bytes()

    freed = offloader.offload_params() + offloader.offload_grads() + offloader.offload_optimizer()

    assert freed == resident > 0
    assert offloader.resident_bytes() == 0
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    assert all(p.grad.untyped_storage().nbytes() == 0 for p in model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if v.numel() > 1]
    assert state and all(v.untyped_storage().nbytes() == 0 for v in state)

    offloader.onload_params()
    offloader.onload_grads()
    offloader.onload_optimizer()
    after = _snapshot(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert offloader.resident_bytes() == resident


def test_tied_parameters_are_moved_once() -> None:
    model = _model()
    every_param = [p for _, p in model.named_parameters(remove_duplicate=False)]
    offloader = Offloader(every_param)
    tied_bytes = model[0].weight.untyped_storage().nbytes()
    total = sum(p.untyped_storage().nbytes() for p in every_param)
    assert offloader.offload_params() == total - tied_bytes  # the tied weight counted once
    offloader.onload_params()
    assert model[3].weight.data_ptr() == model[0].weight.data_ptr()


def test_training_after_offload_cycle_matches_uninterrupted_training() -> None:
    reference_model, reference_optimizer = _trained()
    model, optimizer = copy.deepcopy((reference_model, reference_optimizer))
    offloader = Offloader(model, optimizer)
    params_before = [id(p) for p in model.parameters()]

    offloader.offload_optimizer()
    offloader.offload_grads(keep=False)
    offloader.offload_params()
    offloader.onload_params()
    offloader.onload_optimizer()
    offloader.onload_grads()

    for seed in (2, 3):
        expected = _step(reference_model, reference_optimizer, seed)
        assert torch.equal(_step(model, optimizer, seed), expected)
    assert [id(p) for p in model.parameters()] == params_before
    for got, want in zip(model.parameters(), reference_model.parameters(), strict=True):
        assert torch.equal(got, want)


def test_dropped_grads_come_back_as_zeros() -> None:
    model, optimizer = _trained()
    offloader = Offloader(model, optimizer)
    assert offloader.offload_grads(keep=False) > 0
    offloader.onload_grads()
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_views_into_one_flat_buffer_share_one_host_copy() -> None:
    flat = torch.arange(12, dtype=torch.float32)
    views = [flat[:4].view(2, 2), flat[4:]]
    offloader = Offloader(views)
    assert offloader.offload_params() == 48
    assert flat.untyped_storage().nbytes() == 0
    offloader.onload_params()
    assert torch.equal(views[1], torch.arange(4, 12, dtype=torch.float32))


def test_master_weights_outside_the_model_count_as_optimizer_state() -> None:
    model = _model()
    masters = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.SGD(masters, lr=0.1)
    offloader = Offloader(model, optimizer)
    expected = sum(m.untyped_storage().nbytes() for m in masters)
    assert offloader.offload_optimizer() == expected
    offloader.onload_optimizer()


def test_double_offload_and_stray_onload_raise() -> None:
    offloader = Offloader(_model())
    with pytest.raises(OffloadStateError, match="params are not offloaded"):
        offloader.onload_params()
    offloader.offload_params()
    assert offloader.is_offloaded("params") and not offloader.is_offloaded("grads")
    with pytest.raises(OffloadStateError, match="already offloaded"):
        offloader.offload_params()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_offload_frees_allocator_memory_and_restores_bits() -> None:
    model = _model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer, seed=1)  # grads and optimizer state on the device
    before = [t.cpu() for t in _snapshot(model, optimizer)]
    offloader = Offloader(model, optimizer)
    allocated = torch.cuda.memory_allocated()

    freed = offloader.offload_params() + offloader.offload_optimizer() + offloader.offload_grads()

    assert allocated - torch.cuda.memory_allocated() >= freed > 0
    assert offloader.resident_bytes() == 0
    offloader.onload_params()
    offloader.onload_optimizer()
    offloader.onload_grads()
    after = [t.cpu() for t in _snapshot(model, optimizer)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
