"""A run's identity, so that its folder resumes only from its own checkpoints.

A run gets an identity when its folder is created, recorded in ``run.json`` and copied into the
manifest of every checkpoint it writes (`entrepot.grpo.run.manifest`):

- ``run_id``: a random id (uuid4), made once;
- ``config_hash``: the sha256 of the config keys a resume must not change (`FIXED_KEYS`: what is
  trained, on which data and with which update; not max_steps, evaluation, logging, resources), whose
  values ``run.json`` also keeps, so that a refused resume can name the key that changed.

A resume (`entrepot.grpo.run.resume.resume_point`) refuses a checkpoint whose identity is not its
folder's, a config that changes a fixed key, and a run folder holding symbolic links (a resume
writes metrics.jsonl and checkpoints into the folder: through a link they would land elsewhere).
Copying a whole run folder copies its identity: the copy is the same run, continued elsewhere.
Free of heavy imports: `train` and the CLI check a resume before torch loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig, config_to_dict
from entrepot.grpo.errors import CheckpointError, GRPOConfigError

__all__ = [
    "FIXED_KEYS",
    "RUN_FILE",
    "RunIdentity",
    "check_config_unchanged",
    "check_new_run_folder",
    "check_no_links",
    "create_run",
    "read_run",
]

RUN_FILE = "run.json"
_FORMAT = 1
# What a checkpoint's state depends on: resuming with other values would continue another run.
FIXED_KEYS = ("seed", "model", "data", "rollout", "algorithm", "reward", "engine.train", "parallel.train")
_WARM_START = "to start from its weights instead, point model.path at an exported model directory"


@dataclass(frozen=True)
class RunIdentity:
    """Who a run (and each of its checkpoints) is: its id and the hash of its fixed config keys."""

    run_id: str
    config_hash: str

    def __str__(self) -> str:
        return f"run {self.run_id} (config {self.config_hash[:12]})"


def fixed_values(config: GRPOConfig) -> dict[str, Any]:
    """The values of `FIXED_KEYS` (a section as its nested dict), as JSON values."""
    tree = config_to_dict(config)
    values: dict[str, Any] = {}
    for key in FIXED_KEYS:
        node: Any = tree
        for part in key.split("."):
            node = node[part]
        values[key] = node
    return json.loads(json.dumps(values))  # tuples as lists, as run.json reads back


def _hash(values: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def check_no_links(run_dir: Path) -> None:
    """Refuse a run folder that holds a symbolic link anywhere inside (the folder itself may be one).

    Raises CheckpointError naming the link and its target.
    """
    if not run_dir.is_dir():
        return
    for parent, dirs, files in os.walk(run_dir):  # does not descend into linked directories
        for name in sorted([*dirs, *files]):
            path = Path(parent, name)
            if path.is_symlink():
                raise CheckpointError(
                    f"run folder {str(run_dir)!r} holds a symbolic link: {path.relative_to(run_dir)} -> "
                    f"{os.readlink(path)}; a run writes its metrics and checkpoints into its own folder, "
                    "and reads back only what it wrote there: replace the link with what it points to, "
                    "or remove it"
                )


def check_new_run_folder(run_dir: Path) -> None:
    """Refuse to start a new run in a folder that already holds one (or holds a symbolic link)."""
    check_no_links(run_dir)
    if (run_dir / RUN_FILE).exists():
        raise CheckpointError(
            f"run folder {str(run_dir)!r} already holds a run ({RUN_FILE}): resume it "
            "(resume=True, rl grpo train --resume) or start the new run in another folder"
        )


def create_run(run_dir: Path, config: GRPOConfig) -> RunIdentity:
    """Make a new run's identity and write it to ``run_dir/run.json`` (the folder must hold no run)."""
    check_new_run_folder(run_dir)
    fixed = fixed_values(config)
    identity = RunIdentity(uuid.uuid4().hex, _hash(fixed))
    record = {
        "format": _FORMAT,
        "run_id": identity.run_id,
        "config_hash": identity.config_hash,
        "fixed": fixed,
    }
    (run_dir / RUN_FILE).write_text(json.dumps(record, indent=1))
    return identity


def _read_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise CheckpointError(
            f"run folder {str(run_dir)!r} has no {RUN_FILE}: it was started by entrepot-grpo < 0.3.1, "
            "before runs had an identity, so its checkpoints cannot be shown to be its own; start a new "
            f"run ({_WARM_START})"
        ) from error
    except (OSError, ValueError) as error:
        raise CheckpointError(f"run folder {str(run_dir)!r}: {RUN_FILE} is unreadable ({error})") from error
    fields_ok = isinstance(record, dict) and record.get("format") == _FORMAT
    if not (fields_ok and all(isinstance(record.get(k), str) for k in ("run_id", "config_hash"))):
        raise CheckpointError(f"run folder {str(run_dir)!r}: {RUN_FILE} is not format {_FORMAT}")
    if not isinstance(record.get("fixed"), dict) or _hash(record["fixed"]) != record["config_hash"]:
        raise CheckpointError(
            f"run folder {str(run_dir)!r}: {RUN_FILE}'s fixed config does not match its config_hash (edited)"
        )
    return record


def read_run(run_dir: Path) -> RunIdentity:
    """The identity recorded in ``run_dir/run.json``; CheckpointError if it is missing or damaged."""
    record = _read_record(run_dir)
    return RunIdentity(record["run_id"], record["config_hash"])


def check_config_unchanged(run_dir: Path, config: GRPOConfig) -> None:
    """Refuse a resume whose config changes a fixed key of the run (GRPOConfigError naming each)."""
    recorded = _read_record(run_dir)["fixed"]
    now = fixed_values(config)
    changed = sorted(
        f"{key} ({before!r} -> {after!r})"
        for section in FIXED_KEYS
        if section in recorded
        for key, before, after in _differences(section, recorded[section], now[section])
    )
    if changed:
        raise GRPOConfigError(
            f"resuming {str(run_dir)!r} would change what its checkpoints were trained with: "
            f"{', '.join(changed)}; these keys are fixed for a run ({', '.join(FIXED_KEYS)}): resume "
            f"without changing them, or start a new run ({_WARM_START})"
        )


def _differences(key: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """(dotted key, recorded value, new value) of every leaf that differs.

    Only keys both sides have are compared: a key added by a later entrepot-grpo (whose default keeps
    what earlier versions did) does not stop a run started before it from resuming.
    """
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            diff
            for name in sorted(before.keys() & after.keys())
            for diff in _differences(f"{key}.{name}", before[name], after[name])
        ]
    return [] if before == after else [(key, before, after)]
