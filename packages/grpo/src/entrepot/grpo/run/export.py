"""A checkpoint as an HF model directory: config.json, safetensors and the tokenizer (chat template kept).

`export_checkpoint(run_dir, step)` verifies the checkpoint against its manifest, then writes what
`transformers.AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained` and vLLM load.
No training, Ray or dock starts; only the weights are read:

| checkpoint                          | weights written                                                  |
|-------------------------------------|------------------------------------------------------------------|
| torch engine                        | ``model.safetensors`` (HF names) loaded into `initial_model`'s   |
|                                     | model, saved with ``save_pretrained``                            |
| LoRA (`model.lora.rank` > 0), or    | the checkpoint's ``hf/`` (the merged model, exported at save     |
| ``engine.train: megatron``          | time), copied; LoRA's ``adapter/`` (peft's) comes along          |

The tokenizer is `model.path`'s (saved with ``save_pretrained``, so its chat template comes along; the
directory must still exist), or, for the built default, its `CharTokenizer` as a `tokenizers`
word-level tokenizer over single characters with the same ids (`char_tokenizer_as_hf`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig, config_from_dict
from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run.manifest import read_manifest, verify_manifest
from entrepot.grpo.run.resume import latest_checkpoint

__all__ = ["char_tokenizer_as_hf", "checkpoint_directory", "export_checkpoint", "load_trained"]

_HF_FILES = ("config.json", "generation_config.json", "model.safetensors")  # of a checkpoint's hf/


def checkpoint_directory(run_dir: str | Path, step: int | None = None) -> Path:
    """The run's checkpoint of `step` (None: its newest complete one); a `CheckpointError` if none."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        raise CheckpointError(f"{str(run_dir)!r} is not a run directory (it has no checkpoints/ folder)")
    if step is None:
        found = latest_checkpoint(Path(run_dir))
        if found is None:
            raise CheckpointError(f"run directory {str(run_dir)!r} has no complete checkpoint")
        return found
    directory = root / f"step_{step:06d}"
    if not directory.is_dir():
        steps = sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*") if p.name[5:].isdigit())
        raise CheckpointError(
            f"run directory {str(run_dir)!r} has no checkpoint of step {step}; it has {steps}"
        )
    return directory


def export_checkpoint(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """Write a checkpoint of a run as an HF model directory and return that directory.

    Args:
        run_dir: the run directory.
        step: the checkpoint's step; None: the newest complete checkpoint.
        out: the directory to write (it must not exist or be empty); default
            ``<run_dir>/export/step_NNNNNN``.

    Raises:
        CheckpointError: no such checkpoint, a file that does not match its manifest, a LoRA or
            megatron checkpoint without its ``hf/``, or an `out` that holds files already.
    """
    directory = checkpoint_directory(run_dir, step)
    target = Path(out) if out is not None else Path(run_dir) / "export" / directory.name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(
            f"export directory {str(target)!r} exists and is not empty: remove it or choose another"
        )
    listed = read_manifest(directory).files  # no manifest: a CheckpointError naming the checkpoint
    read = {name for name in listed if name in ("state.json", "model.safetensors") or name.startswith("hf/")}
    manifest = verify_manifest(directory, hash_only=read)  # every file present; those read also hashed
    if manifest.step is not None and f"step_{manifest.step:06d}" != directory.name:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is step {manifest.step} in its manifest: a checkpoint copied "
            "or renamed"
        )
    config = config_from_dict(json.loads((directory / "state.json").read_text())["config"])
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if config.model.lora.enabled or choose_engines(config.engine).train.shards_weights:
            _copy_hf(directory, tmp, listed)
            tokenizer = _tokenizer(config)
        else:
            tokenizer = _save_trained(directory, config, tmp)
        if isinstance(tokenizer, CharTokenizer):
            tokenizer = char_tokenizer_as_hf(tokenizer)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            target.rmdir()  # empty, checked above
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _copy_hf(directory: Path, out: Path, listed: Collection[str]) -> None:
    """Copy the model files of the checkpoint's ``hf/`` export (the merged LoRA or megatron model) and
    LoRA's ``hf/adapter/``."""
    if "hf/model.safetensors" not in listed:
        raise CheckpointError(f"checkpoint {str(directory)!r} has no HF export (hf/model.safetensors)")
    for name in _HF_FILES:
        if f"hf/{name}" in listed:
            shutil.copy2(directory / "hf" / name, out / name)
    adapter = sorted(name for name in listed if name.startswith("hf/adapter/"))
    for name in adapter:  # LoRA: peft's adapter directory beside the merged model
        target = out / name.removeprefix("hf/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(directory / name, target)


def _save_trained(directory: Path, config: GRPOConfig, out: Path) -> Any:
    """Load the torch engine's ``model.safetensors`` into the run's model, save it to `out`; its tokenizer."""
    from entrepot.grpo.engines.policy import quiet_hf_progress

    model, tokenizer = load_trained(directory, config)
    save: Any = model.save_pretrained  # an HF model's, or EmbeddedGPT2's through its HF view
    with quiet_hf_progress():
        save(out)
    return tokenizer


def load_trained(directory: Path, config: GRPOConfig) -> tuple[Any, Any]:
    """The run's model (`initial_model`) holding a torch-engine checkpoint's ``model.safetensors``, and
    its tokenizer; a `CheckpointError` if the weights do not fit the model."""
    import torch
    from safetensors.torch import load_file

    from entrepot.grpo.engines.policy import initial_model

    model, setup = initial_model(config)
    weights = load_file(str(directory / "model.safetensors"))
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"checkpoint {str(directory)!r}: model.safetensors does not fit the run's model: missing "
            f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        )
    return model, setup.tokenizer


def _tokenizer(config: GRPOConfig) -> Any:
    """The run's tokenizer: `model.path`'s, or the task's built-in one."""
    from entrepot.grpo.data.sources import build_task
    from entrepot.grpo.engines.models import load_tokenizer

    loaded = load_tokenizer(config.model.path) if config.model.path is not None else None
    return build_task(config, loaded).tokenizer


def char_tokenizer_as_hf(tokenizer: CharTokenizer) -> Any:
    """The built-in character tokenizer as an HF fast tokenizer with the same ids.

    One token per character (a `tokenizers` word-level model behind a split into single characters),
    ``<pad>`` and ``<eos>`` as special tokens, decoded without separators; a character outside the
    alphabet is an error, as in `CharTokenizer.encode`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(tokenizer.tokens)}))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=tokenizer.pad_token, eos_token=tokenizer.eos_token
    )
