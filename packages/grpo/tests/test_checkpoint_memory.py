"""A checkpoint of host tensors writes them as they are: no second copy of weights and optimizer state."""

from __future__ import annotations

import torch

from entrepot.grpo.run.checkpoint import _host


def test_a_host_tensor_with_its_own_storage_is_written_as_it_is() -> None:
    weight = torch.randn(4, 3)
    assert _host(weight).data_ptr() == weight.data_ptr()


def test_a_view_into_a_larger_storage_is_copied_to_its_own() -> None:
    flat = torch.randn(24)  # as megatron's or a fused layout's parameters share one buffer
    for view in (flat[:12].view(4, 3), flat[12:].view(4, 3), flat.view(6, 4).t()):
        copy = _host(view)
        assert torch.equal(copy, view) and copy.is_contiguous()
        assert copy.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
        assert copy.untyped_storage().nbytes() == copy.numel() * copy.element_size()


def test_the_estimate_counts_a_checkpoints_host_copy_only_off_the_host() -> None:
    from entrepot.grpo.config import load_config
    from entrepot.grpo.run.memory import estimate_memory

    on_cpu = estimate_memory(load_config(None, []))
    assert on_cpu.stages["checkpoint"][1] <= on_cpu.stages["update"][1]  # nothing beyond the update's host
    on_gpu = estimate_memory(load_config(None, ["engine.device=cuda"]))
    copied = on_gpu.params + on_gpu.reference + on_gpu.optimizer
    assert on_gpu.stages["checkpoint"][1] >= copied > 0
