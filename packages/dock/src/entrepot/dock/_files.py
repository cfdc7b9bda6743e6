"""Dock files that are verified before they are read: atomic writes and a sha256 manifest.

`save` writes ``<path>`` through a temp file in the same directory (flushed, fsynced, renamed, the
directory fsynced), then, last, the sidecar ``<path>.manifest.json`` with the file's size and hash.
`load` reads the file once into memory, checks it against the manifest and only then hands the bytes
to the deserialiser: a truncated, bit-flipped or half-written file never reaches the live dock.
sha256 is the fastest strong hash of hashlib where CPUs have SHA instructions (about 2x blake2b;
packages/grpo/benchmarks/bench_manifest.py measures it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

from entrepot.dock._errors import DockStateError

HASH_ALGORITHM = "sha256"
MANIFEST_SUFFIX = ".manifest.json"
_MANIFEST_FORMAT = 1


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar manifest of a dock file: ``<path>.manifest.json``."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.hash = hashlib.new(HASH_ALGORITHM)
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def fsync_directory(directory: Path) -> None:
    """Make renames inside `directory` durable (its entry list reaches the disk)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> _HashingWriter:
    """Write a temp file next to `path` with `write`, fsync it and rename it over `path`.

    Returns the writer that hashed and counted the bytes on their way to the file.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            writer = _HashingWriter(file)
            write(cast(IO[bytes], writer))  # duck-typed: write + flush is all a serialiser needs
            file.flush()
            os.fsync(file.fileno())
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return writer


def write_verified(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` atomically with `write(file)`, then its manifest (size, hash) last."""
    path = Path(path)
    manifest = manifest_path(path)
    manifest.unlink(missing_ok=True)  # until the new one lands, a crash leaves "no manifest", not a stale one
    written = _replace_atomically(path, write)
    fsync_directory(path.parent)
    record = {
        "format": _MANIFEST_FORMAT,
        "file": path.name,
        "size": written.size,
        "algorithm": HASH_ALGORITHM,
        "hash": written.hash.hexdigest(),
    }
    _replace_atomically(manifest, lambda file: file.write(json.dumps(record, indent=1).encode()))
    fsync_directory(path.parent)


def read_verified(path: str | os.PathLike[str], source: str) -> bytes:
    """The bytes of `path` once they match its manifest; else a DockStateError naming `source`."""
    path = Path(path)
    record = _read_manifest(path, source)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DockStateError(source, f"cannot be read: {error}") from error
    if len(data) != record["size"]:
        raise DockStateError(
            source,
            f"is {len(data)} bytes but its manifest says {record['size']} (truncated or overwritten)",
        )
    digest = hashlib.new(record["algorithm"], data).hexdigest()
    if digest != record["hash"]:
        raise DockStateError(
            source, f"{record['algorithm']} {digest} does not match its manifest's {record['hash']} (corrupt)"
        )
    return data


def _read_manifest(path: Path, source: str) -> dict[str, Any]:
    manifest = manifest_path(path)
    try:
        record = json.loads(manifest.read_text())
    except FileNotFoundError as error:
        raise DockStateError(
            source,
            f"has no manifest {str(manifest)!r}: the save did not finish, or the file was written by "
            "entrepot-dock 0.1.0, which wrote none (save it again with this version)",
        ) from error
    except (OSError, ValueError) as error:
        raise DockStateError(source, f"manifest {str(manifest)!r} is unreadable: {error}") from error
    fields = {"file": str, "size": int, "algorithm": str, "hash": str}
    if not isinstance(record, dict) or any(type(record.get(k)) is not t for k, t in fields.items()):
        raise DockStateError(
            source, f"manifest {str(manifest)!r} lacks one of {list(fields)} or has a wrong type"
        )
    if record["file"] != path.name:
        raise DockStateError(
            source, f"manifest {str(manifest)!r} describes {record['file']!r}, not {path.name!r}"
        )
    if record["algorithm"] not in hashlib.algorithms_guaranteed:
        raise DockStateError(
            source, f"manifest {str(manifest)!r} names an unknown hash algorithm {record['algorithm']!r}"
        )
    return record
