"""``eval.json`` and ``eval_samples.jsonl``: an evaluation's figures and responses, each naming what was
evaluated (run id, step, manifest hash), the config hash, the seeds and the package versions.

Both files are written whole to a temporary name and renamed, so a reader never sees half of one.
The figures are rounded to nothing: a second evaluation writes the same bytes (but ``created``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig, config_to_dict
from entrepot.grpo.errors import EvalError
from entrepot.grpo.evaluation.runner import EvalRecord, EvalSettings

__all__ = ["EVAL_FILE", "SAMPLES_FILE", "config_hash", "package_versions", "read_eval", "write_eval"]

EVAL_FILE = "eval.json"
SAMPLES_FILE = "eval_samples.jsonl"
_ENTREPOT = ("entrepot-batching", "entrepot-dock", "entrepot-resharding", "entrepot-grpo", "entrepot-cli")
_DISTRIBUTIONS = (*_ENTREPOT, "torch", "transformers")


def config_hash(config: GRPOConfig) -> str:
    """sha256 of the whole config as sorted JSON (the evaluated model's, with the evaluation's engine)."""
    return hashlib.sha256(
        json.dumps(config_to_dict(config), sort_keys=True, default=str).encode()
    ).hexdigest()


def package_versions() -> dict[str, str]:
    """The installed versions of the Entrepot packages, torch and transformers (absent ones left out)."""
    found = {}
    for name in _DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def header(
    model: Mapping[str, Any], config: GRPOConfig, settings: EvalSettings, data: Mapping[str, Any],
    ks: Sequence[int], engine: str,
) -> dict[str, Any]:  # fmt: skip
    """What both files start with: the model evaluated, the config hash, the settings and seeds, versions."""
    return {
        "model": dict(model),
        "config_hash": config_hash(config),
        "engine": engine,
        "data": dict(data),
        "settings": {**asdict(settings), "ks": list(ks)},
        "seeds": {"config": config.seed, "sampling": settings.seed},
        "versions": package_versions(),
    }


def write_eval(
    directory: Path, head: Mapping[str, Any], summary: Mapping[str, float], audit: Mapping[str, Any],
    records: Sequence[EvalRecord],
) -> tuple[Path, Path]:  # fmt: skip
    """Write ``eval.json`` (the header, the figures, the audit) and ``eval_samples.jsonl`` (a first line
    with the header, then one record per response) into `directory`; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    doc = {"format": 1, **head, "created": created, "metrics": dict(summary), "audit": dict(audit)}
    lines = [json.dumps({"header": dict(head)}, sort_keys=True)]
    lines += [json.dumps(r.to_json(), sort_keys=True) for r in records]
    out = directory / EVAL_FILE, directory / SAMPLES_FILE
    _write(out[1], "\n".join(lines) + "\n")
    _write(out[0], json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_eval(path: str | Path) -> tuple[dict[str, Any], list[EvalRecord]]:
    """An evaluation written by `write_eval`: `path` is its ``eval.json`` or a directory holding one; its
    document and its records (from ``eval_samples.jsonl`` beside it; none when that file is gone)."""
    where = Path(path)
    file = where / EVAL_FILE if where.is_dir() else where
    if not file.is_file():
        raise EvalError(f"{str(where)!r} is not an eval.json nor a directory holding one")
    try:
        doc = json.loads(file.read_text())
    except ValueError as error:
        raise EvalError(f"{str(file)!r} is not valid JSON ({error})") from None
    if not isinstance(doc, dict) or doc.get("format") != 1 or "metrics" not in doc:
        raise EvalError(f"{str(file)!r} is not an evaluation written by rl eval (format 1 with metrics)")
    records: list[EvalRecord] = []
    samples = file.with_name(SAMPLES_FILE)
    if samples.is_file():
        for line in samples.read_text().splitlines()[1:]:
            records.append(EvalRecord(**json.loads(line)))
    return doc, records
