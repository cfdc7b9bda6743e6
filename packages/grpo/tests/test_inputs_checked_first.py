"""`train` checks every input before it creates anything; library logs go to the run's engines.log."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import pytest
from tests_support_models import tiny_model_dir, word_tokenizer

from entrepot.grpo import load_config, train
from entrepot.grpo.data.prompt_lengths import check_prompt_lengths
from entrepot.grpo.data.sources import FileDataset, TaskSetup, encode_prompt
from entrepot.grpo.data.tasks import Sample
from entrepot.grpo.errors import DataError
from entrepot.grpo.run.logs import EngineLogs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("model"))  # 32 positions, a chat template


def _setup(use_chat_template: bool) -> TaskSetup:
    source = FileDataset([Sample(prompt="1", answer="1")], [])
    return TaskSetup(tokenizer=word_tokenizer(), source=source, max_new_tokens=8,
                     use_chat_template=use_chat_template)  # fmt: skip


@pytest.mark.parametrize("use_chat_template", [True, False])
def test_the_batched_lengths_are_those_of_encode_prompt(use_chat_template: bool) -> None:
    setup = _setup(use_chat_template)
    prompts = ["what is 1 ?", "what is 1 2 3 ? " * 3, "", "user : what"]
    longest = max(len(encode_prompt(setup, p, 10_000)) for p in prompts)
    check_prompt_lengths(setup, prompts, longest)  # every prompt fits exactly: no error
    with pytest.raises(DataError, match=rf"prompt of {longest} tokens exceeds data\.max_prompt_tokens"):
        check_prompt_lengths(setup, prompts, longest - 1)


def test_the_error_names_the_first_too_long_prompt_and_counts_the_others() -> None:
    prompts = ["what is 1", "what " * 20, "1", "what " * 30]
    pattern = (r"^prompt of 2\d tokens exceeds data\.max_prompt_tokens \(16\): 'what what .*'\.\.\. "
               r"\(2 of 4 prompts are too long, the longest 3\d tokens\)$")  # fmt: skip
    with pytest.raises(DataError, match=pattern):
        check_prompt_lengths(_setup(True), prompts, 16)


def test_train_refuses_a_too_long_prompt_before_it_creates_the_run_folder(
    model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "what is 1", "answer": "1"}] * 20 + [{"prompt": "what " * 20, "answer": "1"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(None, [f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={data}",
                                "rollout.max_new_tokens=8", "data.max_prompt_tokens=16"])  # fmt: skip
    ready: list[Path] = []
    with pytest.raises(DataError, match=r"exceeds data\.max_prompt_tokens \(16\)"):
        train(config, tmp_path / "run", on_ready=ready.append)
    assert not (tmp_path / "run").exists() and ready == []


def test_library_records_and_warnings_are_held_then_written_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    library = logging.getLogger("some_engine")  # like transformers: its own console handler, no propagation
    console = logging.StreamHandler()
    library.addHandler(console)
    library.propagate = False
    before = logging.getLogger().handlers[:]
    try:
        with EngineLogs() as logs:
            assert os.environ["VLLM_CONFIGURE_LOGGING"] == "0"
            library.warning("loaded before the folder exists")
            assert console not in library.handlers
            imported_later = logging.getLogger("engine_imported_later")  # gets its console handler now
            imported_later.addHandler(logging.StreamHandler())
            imported_later.propagate = False
            imported_later.warning("an import-time warning")
            logs.to_file(tmp_path / "engines.log")
            warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
            logging.getLogger("vllm.engine").info("an engine's info line")
        text = (tmp_path / "engines.log").read_text()
        assert "WARNING some_engine: loaded before the folder exists" in text
        assert "WARNING engine_imported_later: an import-time warning" in text
        assert "a library's deprecation" in text and "INFO vllm.engine: an engine's info line" in text
        assert library.handlers == [console] and library.propagate is False  # put back
        assert logging.getLogger().handlers == before and "VLLM_CONFIGURE_LOGGING" not in os.environ
    finally:
        library.removeHandler(console)
        library.propagate = True


def test_records_of_a_run_that_never_gets_a_folder_are_dropped(tmp_path: Path) -> None:
    with EngineLogs():
        logging.getLogger("transformers.tokenization").warning("a tokenizer warning")
    assert not list(tmp_path.iterdir())
