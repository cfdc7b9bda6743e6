"""The ``code_tests`` verifier: run the response's Python code against the row's tests in the sandbox.

- The program is the response's last fenced ``python`` (or ``py``) block; a last block cut off by the
  token budget (no closing fence) counts to the end; no such block: the whole response.
- The row's tests are its answer column (``data.answer_field``, e.g. ``tests``): a JSON list of Python
  sources, each one test run in the program's namespace (MBPP's ``test_list`` as is:
  ``["assert f(1) == 2", ...]``). A row whose tests are not such a list is a `SandboxError` naming
  the row before the run (`check_tests`, from `rewards.check_gold_answers`).
- The reward: passed tests / total tests (``reward.code.partial_credit``; false: 1 or 0), unless
  ``reward.code.verdict_scores`` fixes the verdict's reward.

A batch runs on a bounded thread pool (`sandbox.run_many`), so N programs take about
N / ``max_workers`` deadlines. The limits are the process's, set from ``reward.code`` by `configure`
in each process that scores (the reward workers, the samples writer, evaluation); default limits
until then.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from entrepot.grpo.errors import SandboxError
from entrepot.grpo.sandbox import SandboxLimits, SandboxResult, Verdict, isolation, run_many

if TYPE_CHECKING:
    from entrepot.grpo.config import CodeRewardConfig

__all__ = ["CODE_TESTS", "CodeTests", "check_tests", "code_tests", "configure", "extract_program",
           "parse_tests", "verdict_metrics"]  # fmt: skip

CODE_TESTS = "code_tests"
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_program(response: str) -> str:
    """The last fenced python block of `response` (to its end if unclosed), else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def parse_tests(answer: str, row: int | None = None) -> list[str]:
    """A row's tests from its answer text: a non-empty JSON list of strings; else `SandboxError`."""
    where = f"row {row}" if row is not None else "a row"
    try:
        tests = json.loads(answer)
    except json.JSONDecodeError:
        tests = None
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise SandboxError(
            f"code_tests: {where}'s tests ({answer[:60]!r}) must be a non-empty JSON list of Python "
            'sources, e.g. ["assert f(1) == 2"]'
        )
    return tests


def check_tests(answers: Sequence[str]) -> None:
    """`SandboxError` naming the first row (from 0) whose tests `parse_tests` refuses."""
    for row, answer in enumerate(answers):
        parse_tests(answer, row)


class CodeTests:
    """The verifier: limits, the verdict-to-reward mapping and the batch's concurrency."""

    def __init__(self) -> None:
        self.limits = SandboxLimits()
        self.partial_credit, self.max_workers, self.require_isolation = True, 8, False
        self.verdict_scores: dict[str, float] = {}

    def configure(self, code: CodeRewardConfig) -> None:
        """Take the limits and the mapping of ``reward.code``."""
        self.limits = SandboxLimits(
            timeout_s=code.timeout_s, memory_mb=code.memory_mb, output_bytes=code.output_kb * 1024
        )
        self.partial_credit, self.max_workers = code.partial_credit, code.max_workers
        self.require_isolation, self.verdict_scores = code.require_isolation, dict(code.verdict_scores)

    def reward(self, result: SandboxResult) -> float:
        """A verdict's reward: its fixed score if mapped, else the tests' credit (or all-or-nothing)."""
        if result.verdict.value in self.verdict_scores:
            return float(self.verdict_scores[result.verdict.value])
        if self.partial_credit:
            return result.credit
        return float(result.verdict is Verdict.PASS)

    def judge(self, responses: Sequence[str], answers: Sequence[str]) -> list[SandboxResult]:
        """Run each response's program against its row's tests, `max_workers` at a time."""
        tests = [parse_tests(a, row) for row, a in enumerate(answers)]
        if self.require_isolation:
            isolation().require()
        programs = [extract_program(r) for r in responses]
        return run_many(programs, tests, self.limits, max_workers=self.max_workers)

    def score_batch(self, responses: Sequence[str], answers: Sequence[str]) -> list[float]:
        """Rewards of a batch (what `rewards.score` calls)."""
        return [self.reward(r) for r in self.judge(responses, answers)]

    def __call__(self, response: str, answer: str) -> float:
        return self.score_batch([response], [answer])[0]


code_tests = CodeTests()  # the registered verifier (`rewards`): one per process


def configure(code: CodeRewardConfig) -> None:
    """Set this process's ``code_tests`` limits and mapping from ``reward.code``."""
    code_tests.configure(code)


def verdict_metrics(results: Sequence[SandboxResult]) -> dict[str, float]:
    """Counts per verdict (``reward/code_<verdict>``, every verdict) and the isolated runs
    (``reward/code_isolated``): summed over ranks."""
    out = {f"reward/code_{v.value}": 0.0 for v in Verdict}
    for result in results:
        out[f"reward/code_{result.verdict.value}"] += 1
    out["reward/code_isolated"] = float(sum(r.isolated for r in results))
    return out
