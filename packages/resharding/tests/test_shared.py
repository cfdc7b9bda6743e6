"""Shared-memory arenas (``_shared``) in a one-rank gloo group: mapped, unlinked, or refused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from entrepot.resharding import _shared


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.skipif(not os.path.isdir(_shared.SHM_DIR), reason="no /dev/shm on this system")
def test_arenas_are_mapped_and_their_files_unlinked(group: None) -> None:
    token = _shared.new_token(None)
    arenas = _shared.open_shared_arenas(token, 0, [4096], None)
    assert arenas is not None and arenas.mine.numel() == 4096
    arenas.mine.fill_(7)
    assert torch.equal(arenas.of[0], torch.full((4096,), 7, dtype=torch.uint8))
    assert not [f for f in os.listdir(_shared.SHM_DIR) if token in f]  # nothing left behind


def test_no_shared_memory_directory_means_none(group: None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_shared, "SHM_DIR", str(tmp_path / "missing"))
    assert _shared.open_shared_arenas("t", 0, [4096], None) is None


def test_too_little_free_space_means_none(group: None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(_shared, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(_shared, "_free_bytes", lambda: 4095)
    assert _shared.open_shared_arenas("t", 0, [4096], None) is None
    assert not list(tmp_path.iterdir())
