"""The checkpoint manifest: every file's relative path, size and sha256, written last, checked first.

`write_manifest` runs once every other file of a checkpoint is in its temp directory: it hashes and
fsyncs each file, writes ``manifest.json`` (fsynced) and fsyncs the directories, so a checkpoint that
has a manifest is whole on disk. `verify_manifest` checks every listed file (present, size, hash)
before anything is loaded. Since format 2 the manifest also names the run that wrote the checkpoint
(`entrepot.grpo.run.identity.RunIdentity`) and its step, which a resume compares with its run
folder (`entrepot.grpo.run.resume`). sha256 is hashlib's fastest strong hash on CPUs with SHA instructions
(about 2x blake2b; benchmarks/bench_manifest.py measures both on the machine at hand).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run.identity import RunIdentity

MANIFEST = "manifest.json"
ALGORITHM = "sha256"
_FORMAT = 2  # 1: files only (entrepot-grpo 0.3.0); 2: also the run's identity and the step


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a checkpoint as the manifest records it."""

    path: str  # relative to the checkpoint directory, '/'-separated
    size: int
    hash: str


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's manifest (after `verify_manifest`: every entry matched the file on disk).

    `owner` and `step` are None in a format-1 manifest, which recorded neither.
    """

    directory: Path
    algorithm: str
    files: dict[str, ManifestEntry]
    owner: RunIdentity | None = None
    step: int | None = None


def _hash_and_sync(path: Path, algorithm: str = ALGORITHM) -> str:
    """The file's hex digest; its data is fsynced on the way (it was just written)."""
    with path.open("rb") as file:
        digest = hashlib.file_digest(file, algorithm).hexdigest()
        os.fsync(file.fileno())
    return digest


def fsync_directory(directory: Path) -> None:
    """Make the names inside `directory` durable (new files, renames)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, *, owner: RunIdentity, step: int) -> Path:
    """Hash and fsync every file under `directory`, write ``manifest.json`` last, fsync the directories.

    Args:
        owner: the run writing the checkpoint; a resume accepts the checkpoint only in that run's folder.
        step: the checkpoint's step; a resume accepts it only in the folder named for that step.
    """
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = [
        {"path": p.relative_to(directory).as_posix(), "size": p.stat().st_size, "hash": _hash_and_sync(p)}
        for p in files
    ]
    manifest = directory / MANIFEST
    with manifest.open("w") as out:
        run = {"id": owner.run_id, "config_hash": owner.config_hash}
        record = {"format": _FORMAT, "algorithm": ALGORITHM, "run": run, "step": step, "files": entries}
        json.dump(record, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_directory(sub)
    fsync_directory(directory)
    return manifest


def read_manifest(directory: Path) -> Manifest:
    """The parsed ``manifest.json`` of a checkpoint (not yet checked against the files)."""
    where = f"checkpoint {str(directory)!r}"
    path = directory / MANIFEST
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise CheckpointError(
            f"{where} has no {MANIFEST}: it is incomplete (its save was stopped before the end) or was "
            "written by entrepot-grpo < 0.3, which wrote none; resume from an earlier checkpoint"
        ) from error
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{where}: {MANIFEST} is unreadable ({error})") from error
    entries = record.get("files") if isinstance(record, dict) else None
    algorithm = record.get("algorithm") if isinstance(record, dict) else None
    known = isinstance(record, dict) and record.get("format") in (1, _FORMAT)
    if not known or not isinstance(entries, list) or algorithm not in hashlib.algorithms_guaranteed:
        raise CheckpointError(
            f"{where}: {MANIFEST} is not format 1 or {_FORMAT} with a 'files' list and a known hash "
            "'algorithm'"
        )
    files: dict[str, ManifestEntry] = {}
    for entry in entries:
        checked = _entry(entry, directory)
        if checked is None:
            raise CheckpointError(f"{where}: {MANIFEST} has a malformed entry {str(entry)[:120]}")
        files[checked.path] = checked
    if record["format"] == 1:
        return Manifest(directory, str(algorithm), files)
    run, step = record.get("run"), record.get("step")
    run_id, config_hash = (run.get("id"), run.get("config_hash")) if isinstance(run, dict) else (None, None)
    if not (isinstance(run_id, str) and isinstance(config_hash, str) and type(step) is int):
        raise CheckpointError(
            f"{where}: {MANIFEST} (format {_FORMAT}) lacks its 'run' (id, config_hash) or 'step'"
        )
    return Manifest(directory, str(algorithm), files, RunIdentity(run_id, config_hash), step)


def _entry(entry: Any, directory: Path) -> ManifestEntry | None:
    """A manifest entry if it is well formed and names a file inside `directory`, else None."""
    if not isinstance(entry, dict):
        return None
    path, size, digest = entry.get("path"), entry.get("size"), entry.get("hash")
    if not (isinstance(path, str) and type(size) is int and size >= 0 and isinstance(digest, str)):
        return None
    inside = (directory / path).resolve().is_relative_to(directory.resolve())
    return ManifestEntry(path, size, digest) if inside and not Path(path).is_absolute() else None


def verify_manifest(directory: Path, *, hash_only: Collection[str] | None = None) -> Manifest:
    """Check every file the manifest lists: present, its size and its hash.

    Raises CheckpointError naming the checkpoint and the file. With `hash_only`, the other files are
    checked by size alone (a missing or truncated file is found; a flipped bit is not).
    """
    manifest = read_manifest(directory)
    where = f"checkpoint {str(directory)!r}"
    for rel, entry in manifest.files.items():
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"{where}: {rel} is missing (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointError(
                f"{where}: {rel} is {size} bytes but {MANIFEST} says {entry.size} (truncated or overwritten)"
            )
        if hash_only is None or rel in hash_only:
            with path.open("rb") as file:
                digest = hashlib.file_digest(file, manifest.algorithm).hexdigest()
            if digest != entry.hash:
                raise CheckpointError(
                    f"{where}: {rel} does not match its {manifest.algorithm} in {MANIFEST} (corrupt)"
                )
    return manifest
