"""The generated arithmetic word problems (data.task=word_problems): seeded, held out, answered right."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests_support_models import tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.config import WordProblemsConfig
from entrepot.grpo.data import rewards
from entrepot.grpo.data.checks import check_task_fits
from entrepot.grpo.data.sources import build_task
from entrepot.grpo.data.word_problems import INSTRUCTION, WordProblems
from entrepot.grpo.errors import GRPOConfigError

# Each sentence's operation, read back from the text alone (independent of the generator's tables).
_READ = [
    (re.compile(r"has (\d+) \w+\.$"), lambda total, n: n),  # the starting amount
    (re.compile(r"(?:buys|gives \w+) (\d+) more \w+\.$"), lambda total, n: total + n),
    (re.compile(r"(?:gives|loses) (\d+) \w+(?: to \w+)?\.$"), lambda total, n: total - n),
    (re.compile(r"has (\d+) times as many \w+ as before\.$"), lambda total, n: total * n),
]


def _solve(prompt: str) -> tuple[int, list[str]]:
    """The answer of a problem worked out from its sentences, and the operations it used."""
    assert prompt.endswith(INSTRUCTION)
    *sentences, question = re.split(r"(?<=\.) ", prompt.removesuffix(INSTRUCTION).strip())
    assert question.startswith("How many") and question.endswith("have now?")
    total, ops = 0, []
    for i, sentence in enumerate(sentences):
        for k, (pattern, apply) in enumerate(_READ):
            match = pattern.search(sentence)
            if match and (k == 0) == (i == 0):
                total = apply(total, int(match.group(1)))
                ops.append("=+-x"[k])
                break
        else:
            raise AssertionError(f"unreadable sentence {sentence!r}")
    return total, ops


@pytest.mark.parametrize(
    "config",
    [WordProblemsConfig(), WordProblemsConfig(steps=3, max_operand=20), WordProblemsConfig(operations="-")],
    ids=["default", "three-steps", "take-away"],
)
def test_every_answer_is_what_the_sentences_say(config: WordProblemsConfig) -> None:
    samples = WordProblems(config, seed=3).batch(0, 300)
    for sample in samples:
        total, ops = _solve(sample.prompt)
        assert sample.answer == str(total) and total >= 0
        assert len(ops) == 1 + config.steps and set(ops[1:]) <= set(config.operations)
    used = {op for s in samples for op in _solve(s.prompt)[1][1:]}
    assert used == set(config.operations)  # every configured operation is drawn
    assert all(rewards.gsm8k(f"so {s.answer}.\n#### {s.answer}", s.answer) == 1.0 for s in samples)


def test_the_stream_is_a_function_of_seed_and_position_and_never_draws_held_out() -> None:
    config = WordProblemsConfig(steps=1, max_operand=3)  # a small space: collisions would happen
    task = WordProblems(config, seed=1)
    assert task.batch(10, 5) == WordProblems(config, seed=1).batch(10, 5)
    assert task.batch(10, 5) == task.batch(0, 15)[10:]  # a position is its own seeded draw
    assert task.batch(0, 20) != WordProblems(config, seed=2).batch(0, 20)
    held = task.held_out(4096)
    assert held[:8] == WordProblems(config, seed=1).held_out(8)  # the same held-out set every time
    assert not {s.prompt for s in held} & {s.prompt for s in task.batch(0, 3000)}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.word_problems.steps=4", "data.word_problems.steps"),
        ("data.word_problems.steps=0", "data.word_problems.steps"),
        ("data.word_problems.max_operand=1", "data.word_problems.max_operand"),
        ("data.word_problems.operations=+/", "data.word_problems.operations"),
        ("data.word_problems.operations=++", "data.word_problems.operations"),
        ("data.word_problems.operations=-", "data.word_problems.operations"),  # two steps of '-'
        ("data.word_problems.stepz=2", "data.word_problems.stepz"),
    ],
)
def test_bad_difficulty_is_refused_naming_the_key(override: str, key: str, tmp_path: Path) -> None:
    with pytest.raises(GRPOConfigError, match=f"^(unknown key ')?{re.escape(key)}"):
        load_config(None, ["data.task=word_problems", f"model.path={tmp_path}", "data.word_problems.steps=2",
                           override])  # fmt: skip


def test_word_problems_need_a_model_tokenizer_and_enough_distinct_problems(tmp_path: Path) -> None:
    with pytest.raises(GRPOConfigError, match=r"^model\.path"):
        load_config(None, ["data.task=word_problems"])
    few = load_config(None, ["data.task=word_problems", f"model.path={tmp_path}",
                             "data.word_problems.max_operand=2"])  # fmt: skip
    with pytest.raises(GRPOConfigError, match=r"^data\.word_problems\.max_operand \(2\)"):
        check_task_fits(few)  # 400 problems: fewer than the 4096 held out
    check_task_fits(load_config(None, ["data.task=word_problems", f"model.path={tmp_path}"]))


def test_build_task_serves_word_problems_under_the_chat_template(tmp_path: Path) -> None:
    from entrepot.grpo.engines.models import load_tokenizer

    model_dir = tiny_model_dir(tmp_path / "model")
    config = load_config(None, ["data.task=word_problems", f"model.path={model_dir}", "seed=5"])
    setup = build_task(config, load_tokenizer(model_dir))
    assert setup.use_chat_template and setup.max_new_tokens == 64
    assert setup.source.batch(0, 4) == WordProblems(WordProblemsConfig(), seed=5).batch(0, 4)
