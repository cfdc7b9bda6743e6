"""What an LLM judge's output means: a typed verdict, a [0, 1] score, and a cache of both.

A judge's answer is text; the score is the first match of `reward.judge.pattern`'s group, mapped
linearly from `reward.judge.scale` (min, max) to [0, 1]. Whatever the judge writes is a verdict,
never an exception (`JudgeVerdict`): a row without a score gets `reward.judge.fail_score`. The
engine side (a local model, the deadline) is `entrepot.grpo.engines.judge`.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from entrepot.grpo.config import JudgeConfig

__all__ = ["JudgeCache", "JudgeVerdict", "Judgement", "judge_key", "judge_metrics", "parse_judgement"]


class JudgeVerdict(enum.Enum):
    """How one judge answer ended (`reward/judge_<value>` counts each per step)."""

    OK = "ok"  # a number in the scale
    UNPARSEABLE = "unparseable"  # no match of the pattern, or a group that is not a number
    OUT_OF_RANGE = "out_of_range"  # a number outside (min, max)
    TIMEOUT = "timeout"  # the batch's deadline passed before this row was judged
    TOO_LONG = "too_long"  # the judge prompt leaves no room for max_new_tokens in the judge's positions


@dataclass(frozen=True)
class Judgement:
    """One row's judging: its verdict, its [0, 1] score (fail_score unless ok), the number the judge
    wrote (None when unparsed) and its output text."""

    verdict: JudgeVerdict
    score: float
    raw: float | None = None
    output: str = ""


def parse_judgement(output: str, judge: JudgeConfig, pattern: re.Pattern[str] | None = None) -> Judgement:
    """The verdict and score of the judge's `output` (`pattern`: `judge.pattern` compiled, if at hand).

    A number at either end of the scale is ok; one past it is `out_of_range` (never clipped: a judge
    that writes 12 of 10 did not follow the rubric).
    """
    match = (pattern or re.compile(judge.pattern)).search(output)
    if match is None or match.group(1) is None:
        return Judgement(JudgeVerdict.UNPARSEABLE, judge.fail_score, None, output)
    try:
        raw = float(match.group(1))
    except ValueError:
        return Judgement(JudgeVerdict.UNPARSEABLE, judge.fail_score, None, output)
    low, high = judge.scale
    if not low <= raw <= high:  # a NaN or an infinity is out of range too
        return Judgement(JudgeVerdict.OUT_OF_RANGE, judge.fail_score, raw, output)
    return Judgement(JudgeVerdict.OK, (raw - low) / (high - low), raw, output)


def judge_key(judge_prompt: str) -> bytes:
    """The cache key of a formatted judge prompt (it holds the prompt, the response and the answer)."""
    return hashlib.blake2b(judge_prompt.encode("utf-8"), digest_size=16).digest()


class JudgeCache:
    """Judgements by `judge_key`, the `size` most recently used kept (0: nothing kept).

    Only verdicts a greedy judge would repeat are kept (ok, unparseable, out_of_range, too_long),
    never a timeout.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, Judgement] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Judgement | None:
        """The judgement of `key`, now the most recently used; None on a miss."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, judgement: Judgement) -> None:
        """Keep `judgement` (a timeout is not kept); the least recently used goes past `size`."""
        if self.size == 0 or judgement.verdict is JudgeVerdict.TIMEOUT:
            return
        self._entries[key] = judgement
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def judge_metrics(judgements: Iterable[Judgement], cache_hits: int, abandoned: int) -> dict[str, float]:
    """`reward/judge_<verdict>` for every verdict (0 included), the cache hits and abandoned threads."""
    counts = {verdict: 0 for verdict in JudgeVerdict}
    for judgement in judgements:
        counts[judgement.verdict] += 1
    out = {f"reward/judge_{verdict.value}": float(count) for verdict, count in counts.items()}
    out["reward/judge_cache_hits"] = float(cache_hits)
    out["reward/judge_abandoned"] = float(abandoned)
    return out
