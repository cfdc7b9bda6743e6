"""The generated code task (data.task=code_functions): its problems, its split, its config and its checks.

The reference solutions run against their own hidden tests in the sandbox (one run for all of them);
no training run here (packages/cli/tests/test_example_configs.py trains configs/code-tests.yaml).
"""

from __future__ import annotations

import ast
import json

import pytest

from entrepot.grpo import load_config
from entrepot.grpo.asynchronous.rollout_loop import RolloutLoop
from entrepot.grpo.data import code_tests
from entrepot.grpo.data.code_functions import CODE_ALPHABET, HELD_OUT_EVERY, code_problems, code_split
from entrepot.grpo.data.prompt_lengths import check_prompt_lengths
from entrepot.grpo.data.sources import FileDataset, build_task, encode_prompt
from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.errors import DataError, GRPOConfigError
from entrepot.grpo.run.preflight import check_inputs
from entrepot.grpo.sandbox import SandboxLimits, Verdict, run_program

CODE = ["data.task=code_functions", "reward.verifiers={code_tests: 1.0}"]
CODE += ["reward.accuracy_verifier=code_tests"]
BUILT = [*CODE, "model.max_positions=176", "data.max_prompt_tokens=128", "rollout.max_new_tokens=48"]


def _names(problem_tests: tuple[str, ...]) -> set[str]:
    return {ast.parse(t).body[0].test.left.func.id for t in problem_tests}  # type: ignore[attr-defined]


def test_hundreds_of_distinct_problems_each_with_two_to_four_tests_a_constant_cannot_pass() -> None:
    problems = code_problems()
    assert len(problems) >= 300 and len({p.prompt for p in problems}) == len(problems)
    names = set()
    for p in problems:
        assert 2 <= len(p.tests) <= 4 and p.prompt.startswith("Write a Python function ")
        (name,) = _names(p.tests)  # every test calls the function the prompt names
        assert f" {name}(" in p.prompt and name not in names
        names.add(name)
        expected = {ast.dump(ast.parse(t).body[0].test.comparators[0]) for t in p.tests}  # type: ignore[attr-defined]
        assert len(expected) >= 2, p.tests  # `return <one value>` fails at least one test
        assert set(p.prompt) <= set(CODE_ALPHABET)
    assert code_problems() == problems  # fixed, not drawn


def test_every_reference_solution_passes_its_tests_in_the_sandbox_and_a_wrong_one_fails() -> None:
    problems = code_problems()  # every function name is distinct: one program holds them all
    program = "\n".join(p.solution for p in problems)
    tests = [t for p in problems for t in p.tests]
    result = run_program(program, tests, SandboxLimits(timeout_s=30.0))
    assert (result.verdict, result.passed) == (Verdict.PASS, len(tests)), result.output
    wrong = "\n".join(p.solution.replace("return ", "return None and ", 1) for p in problems[:40])
    result = run_program(wrong, [t for p in problems[:40] for t in p.tests], SandboxLimits(timeout_s=30.0))
    assert result.verdict is Verdict.FAIL and result.passed == 0


def test_the_split_is_fixed_disjoint_and_every_eighth() -> None:
    train, held = code_split()
    total = len(code_problems())
    assert len(held) == -(-total // HELD_OUT_EVERY) and len(train) + len(held) == total
    assert not {s.prompt for s in train} & {s.prompt for s in held}
    assert all(isinstance(json.loads(s.answer), list) for s in [*train, *held])
    code_tests.check_tests([s.answer for s in [*train, *held]])
    for seed in (0, 7):  # the run's seed orders training, never moves a problem across the split
        setup = build_task(load_config(None, [*BUILT, f"seed={seed}"]))
        assert isinstance(setup.source, FileDataset) and setup.source.held_out(1000) == held
        assert {s.prompt for s in setup.source.batch(0, len(train))} == {s.prompt for s in train}


def test_the_built_decoder_reads_every_prompt_with_a_printable_character_tokenizer() -> None:
    config = load_config(None, BUILT)
    setup = build_task(config)
    assert isinstance(setup.tokenizer, CharTokenizer) and not setup.use_chat_template
    assert setup.tokenizer.vocab_size == 2 + len(CODE_ALPHABET)
    for sample in setup.source.samples():
        ids = encode_prompt(setup, sample.prompt, config.data.max_prompt_tokens)
        assert setup.tokenizer.decode(ids) == sample.prompt
    check_inputs(config, every_prompt=True)


def test_prompt_lengths_check_counts_characters_of_a_character_tokenizer() -> None:
    """Fix: the batched check called the tokenizer (an HF API); the character one is not callable."""
    setup = build_task(load_config(None, BUILT))
    prompts = [s.prompt for s in setup.source.samples()]
    check_prompt_lengths(setup, prompts, max(len(p) for p in prompts))
    with pytest.raises(DataError, match=r"exceeds data.max_prompt_tokens \(100\)"):
        check_prompt_lengths(setup, prompts, 100)
    with pytest.raises(DataError, match=r"data\.max_prompt_tokens"):
        check_inputs(load_config(None, [*BUILT, "data.max_prompt_tokens=100"]), every_prompt=True)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.task=code_functions"], "reward.verifiers"),
        (["data.task=code_functions", "reward.verifiers={code_tests: 1.0}"], "reward.accuracy_verifier"),
    ],
    ids=["verifiers", "accuracy"],
)
def test_the_task_is_scored_by_code_tests_or_refused(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=rf"{key} .*code_tests"):
        load_config(None, overrides)


def test_the_built_decoder_must_hold_prompt_and_response() -> None:
    with pytest.raises(GRPOConfigError, match=r"model.max_positions \(32\).* >= 176"):
        check_inputs(load_config(None, [*BUILT, "model.max_positions=32"]))


def test_async_rollout_counts_the_verdicts_it_scored_since_the_last_step() -> None:
    """Fix: the asynchronous rollout's scorer returned reward/code_* counts that no metric kept."""
    programs = ["def f(x):\n    return x + 1\n", "def f(x) return", "def f(x):\n    return 0\n"]
    answers = [json.dumps(["assert f(1) == 2", "assert f(2) == 3"])] * 3

    def score(rows: list[int]) -> dict[str, float]:  # what RewardWorker.score_rows returns
        results = code_tests.code_tests.judge([programs[r] for r in rows], [answers[r] for r in rows])
        return {"time/reward": 0.5, **code_tests.verdict_metrics(results)}

    # the counting alone: no engine, dock or ledger is touched, and the thread is never started
    loop = RolloutLoop(None, None, None, None, None, None, score, group_size=1, slots=1,  # type: ignore[arg-type]
                       chunk_tokens=1, pad_token_id=0, generator=None)  # type: ignore[arg-type]  # fmt: skip
    loop._score([0, 1])
    loop._score([2])
    metrics = loop.take_stats().metrics(wall_s=1.0)
    assert {k: metrics[k] for k in ("reward/code_pass", "reward/code_syntax", "reward/code_fail")} == {
        "reward/code_pass": 1.0, "reward/code_syntax": 1.0, "reward/code_fail": 1.0,
    }  # fmt: skip
    assert "time/reward" not in metrics
    assert "reward/code_pass" not in loop.take_stats().metrics(wall_s=1.0)  # counted once
