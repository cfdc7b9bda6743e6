"""Synthetic tasks, the character tokenizer, jsonl/parquet prompt files and local model directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests_support_models import tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.data.sources import build_task, encode_prompt, read_records
from entrepot.grpo.data.tasks import CharTokenizer, SyntheticTask
from entrepot.grpo.errors import DataError, GRPOConfigError


def test_reverse_and_addition_tasks() -> None:
    reverse = SyntheticTask("reverse", 8, seed=0)
    sample = reverse.batch(0, 1)[0]
    assert sample.prompt.endswith("=") and sample.answer == sample.prompt[:-1][::-1]
    addition = SyntheticTask("addition", 3, seed=0).batch(5, 1)[0]
    a, b = addition.prompt[:-1].split("+")
    assert addition.answer == str(int(a) + int(b)).zfill(4)


def test_stream_is_deterministic_and_disjoint_from_held_out() -> None:
    task = SyntheticTask("reverse", 3, seed=1)  # a small space, so collisions would happen
    assert task.batch(10, 5) == SyntheticTask("reverse", 3, seed=1).batch(10, 5)
    held = {s.prompt for s in task.held_out(256)}
    assert not held & {s.prompt for s in task.batch(0, 2000)}


def test_char_tokenizer_round_trip_and_errors() -> None:
    tok = CharTokenizer()
    ids = tok.encode("12+3=")
    assert tok.decode([*ids, tok.eos_token_id]) == "12+3="
    with pytest.raises(ValueError, match="is not in the tokenizer alphabet"):
        tok.encode("x")


def test_jsonl_records_and_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"question {i}", "a": str(i)}) for i in range(10)))
    samples = read_records(path, "q", "a")
    assert samples[3].prompt == "question 3" and samples[3].answer == "3"
    with pytest.raises(DataError, match="has no field 'prompt'"):
        read_records(path, "prompt", "a")


GOOD = json.dumps({"prompt": "12=", "answer": "21"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{GOOD}\n" + json.dumps({"question": "1=", "answer": "1"}),  # line 2 has no prompt field
         r"^data.train_path: .*p\.jsonl:2 has no field 'prompt' \(data.prompt_field\); its fields: "
         r"question, answer; set data.prompt_field to the one that holds it$"),
        (f"{GOOD}\n\n" + json.dumps({"prompt": "1="}),  # blank lines keep their numbers
         r"^data.train_path: .*p\.jsonl:3 has no field 'answer' \(data.answer_field\)"),
        (f"{GOOD}\n{{not json", r"^data.train_path: .*p\.jsonl:2 is not valid JSON: "),
        (f'{GOOD}\n["12=", "21"]', r"^data.train_path: .*p\.jsonl:2 is a JSON list, not a record with "
         r"fields 'prompt' and 'answer'$"),
        (f'{GOOD}\n{{"prompt": "1=", "answer": null}}',
         r"^data.train_path: .*p\.jsonl:2: field 'answer' \(data.answer_field\) is null$"),
        ("", r"^data.train_path: prompt file '.*p\.jsonl' holds no records \(it is empty or blank\)$"),
        ("\n  \n", r"^data.train_path: prompt file '.*p\.jsonl' holds no records"),
    ],
)  # fmt: skip
def test_a_data_error_names_the_key_the_file_and_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_records(path, "prompt", "answer", "data.train_path")


def test_the_eval_file_is_named_by_its_own_key(tmp_path: Path) -> None:
    from entrepot.grpo.engines.models import load_pretrained

    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text(f"{GOOD}\n")
    held.write_text(f"{GOOD}\n" + json.dumps({"prompt": "1=", "solution": "1"}) + "\n")
    model_dir = tiny_model_dir(tmp_path / "model")
    config = load_config(None, [f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={train}",
                                f"data.eval_path={held}"])  # fmt: skip
    with pytest.raises(DataError, match=r"^data.eval_path: .*held\.jsonl:2 has no field 'answer'"):
        build_task(config, load_pretrained(model_dir)[1])


def test_parquet_records(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), path)
    assert [s.answer for s in read_records(path, "prompt", "answer")] == ["1", "2"]


def test_local_model_dir_with_chat_template(tmp_path: Path) -> None:
    from entrepot.grpo.engines.models import load_pretrained

    model_dir = tiny_model_dir(tmp_path / "model")
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": "what is 1 ?", "answer": "1"}) for _ in range(4)))
    model, tokenizer = load_pretrained(model_dir)
    assert type(model).__name__ == "GPT2LMHeadModel"
    config = load_config(None, [f"model.path={model_dir}", "data.task=jsonl", f"data.train_path={data}"])
    setup = build_task(config, tokenizer)
    assert setup.use_chat_template
    ids = encode_prompt(setup, "what is 1 ?", 64)
    assert tokenizer.decode(ids).split()[:2] == ["user", ":"]
    with pytest.raises(DataError, match=r"exceeds data\.max_prompt_tokens"):
        encode_prompt(setup, "what is 1 ?", 2)
    with pytest.raises(DataError, match="must be a local HF model directory"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize(("task", "digits"), [("reverse", 3), ("reverse", 2), ("addition", 1)])
def test_a_task_with_no_prompts_beside_its_held_out_pool_is_refused(task: str, digits: int) -> None:
    """reverse with 2 digits has 100 prompts, all in the 4096-draw held-out pool: drawing one to train
    on looped forever. It is refused before anything starts, naming the key."""
    from entrepot.grpo.data.checks import check_task_fits

    with pytest.raises(GRPOConfigError, match=r"^data\.num_digits"):
        check_task_fits(load_config(None, [f"data.task={task}", f"data.num_digits={digits}"]))
    check_task_fits(load_config(None, [f"data.task={task}", f"data.num_digits={digits + 2}"]))
