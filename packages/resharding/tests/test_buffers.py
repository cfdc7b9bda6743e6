"""MemoryBuffer / ModelWeightBuffer: alignment for every dtype, views across destroy/rebuild."""

from __future__ import annotations

import pytest
import torch

from entrepot.resharding import (
    BufferStateError,
    MemoryBuffer,
    ModelWeightBuffer,
    ShapeMismatchError,
    UnknownWeightError,
)

META = {
    "a": ((3, 5), torch.float32),
    "flag": ((7,), torch.bool),
    "b": ((2, 3), torch.bfloat16),
    "ids": ((5,), torch.int64),
    "c": ((1,), torch.float32),
    "empty": ((0, 4), torch.float32),
    "small": ((3,), torch.int8),
}


@pytest.mark.parametrize("alignment", [1, 16, 256])
def test_every_offset_is_aligned_for_every_dtype(alignment: int) -> None:
    buf = MemoryBuffer(META, alignment_bytes=alignment)
    for name in META:
        dtype, offset, numel = buf.offset(name)
        assert (offset * dtype.itemsize) % alignment == 0 or alignment < dtype.itemsize
        tensor = buf.get(name)
        flat = buf.flat(dtype)
        assert tensor.shape == META[name][0] and tensor.dtype == dtype
        assert tensor.is_contiguous()
        assert tensor.storage_offset() == offset
        assert tensor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert numel == tensor.numel()
    assert set(buf.dtypes) == {torch.float32, torch.bool, torch.bfloat16, torch.int64, torch.int8}


def test_tensors_do_not_overlap_and_alias_the_flat_buffer() -> None:
    buf = MemoryBuffer(META)
    buf.get("a").fill_(1.0)
    buf.get("c").fill_(2.0)
    flat = buf.flat(torch.float32)
    assert flat.sum().item() == 15 + 2
    flat.zero_()
    assert buf.get("a").abs().sum().item() == 0


def test_destroy_frees_storage_and_rebuild_repoints_the_same_tensor_objects() -> None:
    buf = MemoryBuffer(META)
    a = buf.get("a")
    a.fill_(3.0)
    buf.destroy()
    assert not buf.is_allocated
    with pytest.raises(BufferStateError):
        buf.flat(torch.float32)
    assert a.shape == (0,)  # a stale reference is empty, never a window on freed memory
    buf.rebuild(zero=True)
    assert buf.get("a") is a and a.shape == (3, 5)
    assert a.abs().sum().item() == 0
    a.fill_(4.0)
    assert buf.flat(torch.float32)[:15].sum().item() == 60
    assert buf.nbytes == sum(buf.flat(d).numel() * d.itemsize for d in buf.dtypes)


def test_tensor_fetched_while_destroyed_is_pointed_at_storage_on_rebuild() -> None:
    buf = MemoryBuffer({"w": ((4,), torch.float32)})
    buf.destroy()
    w = buf.get("w")
    assert w.numel() == 0
    buf.rebuild(zero=True)
    assert w.shape == (4,)
    w.add_(1)
    assert buf.flat(torch.float32).sum().item() == 4


def test_bad_meta_and_names_raise_typed_errors() -> None:
    with pytest.raises(ShapeMismatchError, match="dtype"):
        MemoryBuffer({"x": ((2,), "float32")})  # type: ignore[dict-item]
    with pytest.raises(ShapeMismatchError, match="shape"):
        MemoryBuffer({"x": ((-1,), torch.float32)})
    with pytest.raises(ShapeMismatchError, match="power of two"):
        MemoryBuffer({"x": ((1,), torch.float32)}, alignment_bytes=24)
    with pytest.raises(UnknownWeightError, match="'nope'"):
        MemoryBuffer(META).get("nope")


def test_model_weight_buffer_copy_offload_onload_roundtrip() -> None:
    torch.manual_seed(0)
    meta = {"w": ((4, 3), torch.float32), "b": ((4,), torch.bfloat16), "step": ((1,), torch.int32)}
    mwb = ModelWeightBuffer(meta)
    source = {
        "w": torch.randn(4, 3),
        "b": torch.randn(4).bfloat16(),
        "step": torch.tensor([7], dtype=torch.int32),
    }
    mwb.copy_by_name(source)
    views = mwb.named_tensors()
    mwb.offload()
    assert mwb.is_offloaded and views["w"].numel() == 0
    with pytest.raises(BufferStateError, match="onload"):
        mwb.copy_by_name(source)
    mwb.onload()
    for name, tensor in source.items():
        assert torch.equal(mwb[name], tensor)
        assert mwb[name] is views[name]
    mwb.destroy()
    mwb.rebuild(zero=True)
    assert mwb["w"].abs().sum().item() == 0


def test_copy_by_name_validates_everything_before_copying() -> None:
    mwb = ModelWeightBuffer({"w": ((2,), torch.float32), "v": ((2,), torch.float32)})
    with pytest.raises(ShapeMismatchError, match="'v'"):
        mwb.copy_by_name([("w", torch.ones(2)), ("v", torch.ones(3))])
    assert mwb["w"].sum().item() == 0
    with pytest.raises(UnknownWeightError, match="'x'"):
        mwb.copy_by_name({"x": torch.ones(2)})
    with pytest.raises(BufferStateError):
        mwb.onload()
