"""The LLM judge (`reward.judge`): parsing into typed verdicts, the cache, the deadline, and training.

Unit tests parse judge outputs and check the config; the judge tests run a tiny random Qwen2 the tests
write (`tests_support_models.tiny_judge_dir`) on the real Llama-family engine, or planted engines that
are real subclasses of it (one answers fixed texts, one hangs); the integration tests train 2 steps of
the embedded default with the judge in the reward, synchronous and asynchronous.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests_support_models import tiny_judge_dir, tiny_reward_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.config import JudgeConfig
from entrepot.grpo.data.judge_verdicts import JudgeCache, Judgement, JudgeVerdict, judge_key, parse_judgement
from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.grpo.engines.judge import LocalJudge, build_judge, check_judge_dir
from entrepot.grpo.engines.models import load_pretrained
from entrepot.grpo.engines.rollout_llama import LlamaRolloutEngine
from entrepot.grpo.errors import DataError, GRPOConfigError

VERDICTS = [f"reward/judge_{v.value}" for v in JudgeVerdict]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_judge_dir(tmp_path_factory.mktemp("judge") / "judge")


# -- parsing and the cache ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "verdict", "score", "raw"),
    [
        ("Score: 7", JudgeVerdict.OK, 0.7, 7.0),
        ("The answer is right.\nScore:10", JudgeVerdict.OK, 1.0, 10.0),
        ("Score: 0", JudgeVerdict.OK, 0.0, 0.0),
        ("Score: 2.5 because ... Score: 9", JudgeVerdict.OK, 0.25, 2.5),  # the first match
        ("Score: 12", JudgeVerdict.OUT_OF_RANGE, 0.0, 12.0),
        ("Score: -1", JudgeVerdict.OUT_OF_RANGE, 0.0, -1.0),
        ("", JudgeVerdict.UNPARSEABLE, 0.0, None),  # missing
        ("\x00\ufffd}{ 7/10 score", JudgeVerdict.UNPARSEABLE, 0.0, None),  # garbage
        ("Score: seven", JudgeVerdict.UNPARSEABLE, 0.0, None),
    ],
)
def test_parse_judgement(output: str, verdict: JudgeVerdict, score: float, raw: float | None) -> None:
    judged = parse_judgement(output, JudgeConfig())
    assert (judged.verdict, judged.raw, judged.output) == (verdict, raw, output)
    assert judged.score == pytest.approx(score)


def test_scale_and_fail_score_map_the_number() -> None:
    judge = JudgeConfig(scale=(1.0, 5.0), fail_score=-0.5, pattern=r"\[\[(\d+)\]\]")
    assert parse_judgement("[[4]]", judge).score == pytest.approx(0.75)
    assert parse_judgement("[[6]]", judge) == Judgement(JudgeVerdict.OUT_OF_RANGE, -0.5, 6.0, "[[6]]")
    assert parse_judgement("Score: 4", judge).verdict is JudgeVerdict.UNPARSEABLE


def test_cache_keeps_the_most_recent_and_never_a_timeout() -> None:
    cache = JudgeCache(2)
    a, b, c, t = (judge_key(text) for text in ("a", "b", "c", "t"))
    ok = Judgement(JudgeVerdict.OK, 1.0, 10.0, "Score: 10")
    cache.put(a, ok)
    cache.put(b, ok)
    assert cache.get(a) == ok  # a is now the most recent: b goes first
    cache.put(c, ok)
    assert cache.get(b) is None and cache.get(a) == ok and cache.get(c) == ok and len(cache) == 2
    cache.put(t, Judgement(JudgeVerdict.TIMEOUT, 0.0))
    assert cache.get(t) is None
    off = JudgeCache(0)
    off.put(a, ok)
    assert off.get(a) is None


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("template", "Rate {prompt}", "must be a template with {response}"),
        ("template", "Rate {response} by {rubric}", r"\['rubric'\]"),
        ("template", "Rate {response", "not a str.format template"),
        ("pattern", "Score: \\d+", "one group"),
        ("pattern", "Score: (\\d+", "does not compile"),
        ("scale", [10, 0], "min < max"),
        ("timeout_s", 0, "> 0"),
        ("max_tokens", 0, ">= 1"),
        ("cache_size", -1, ">= 0"),
    ],
)
def test_bad_judge_config_names_the_key(key: str, value: Any, match: str) -> None:
    with pytest.raises(GRPOConfigError, match=rf"reward\.judge\.{key} .*{match}"):
        load_config(None, ["reward.judge.model_path=judge", f"reward.judge.{key}={value!r}"])


def test_use_reference_needs_a_reference_that_reads_text() -> None:
    with pytest.raises(GRPOConfigError, match=r"reward\.judge\.use_reference .*algorithm.kl_coef = 0"):
        load_config(None, ["reward.judge.use_reference=true", "algorithm.kl_coef=0"])
    with pytest.raises(GRPOConfigError, match=r"reward\.judge\.use_reference .*without model.path"):
        load_config(None, ["reward.judge.use_reference=true", "algorithm.kl_coef=0.01"])
    with pytest.raises(GRPOConfigError, match=r"reward\.judge\.use_reference .*one judge"):
        load_config(None, ["reward.judge.use_reference=true", "reward.judge.model_path=judge"])


def test_a_bad_judge_directory_is_refused_before_start(tmp_path: Path, judge_dir: Path) -> None:
    from entrepot.grpo.run.preflight import check_inputs

    with pytest.raises(DataError, match=r"reward\.judge\.model_path .*config.json"):
        check_inputs(load_config(None, [f"reward.judge.model_path={tmp_path / 'missing'}"]))
    classifier = tiny_reward_model_dir(tmp_path / "rm", "classifier", "qwen2")
    with pytest.raises(
        DataError, match=r"reward\.judge\.model_path .*Qwen2ForSequenceClassification.*causal"
    ):
        check_judge_dir(str(classifier))
    check_judge_dir(str(judge_dir))  # the good one passes


# -- the judge on an engine -----------------------------------------------------------------------


class _Answers(LlamaRolloutEngine):
    """The real engine's class, answering each rubric by its response: good -> 7, high -> 12, else junk."""

    tokenizer: Any = None

    def generate(self, prompts: Sequence[Sequence[int] | torch.Tensor], params: SamplingParams, *,
                 pad_token_id: int = 0, generator: torch.Generator | None = None) -> Rollout:  # fmt: skip
        rows = []
        for prompt in prompts:
            text = self.tokenizer.decode(list(prompt))
            answer = (
                "Score: 7"
                if "Response:\ngood" in text
                else "Score: 12"
                if "Response:\nhigh" in text
                else "~#!"
            )
            rows.append(self.tokenizer(answer)["input_ids"])
        return Rollout.from_rows(rows, [torch.zeros(len(r)) for r in rows])


class _Seven(LlamaRolloutEngine):
    """The real engine's class, answering every rubric "Score: 7"."""

    tokenizer: Any = None

    def generate(self, prompts: Sequence[Sequence[int] | torch.Tensor], params: SamplingParams, *,
                 pad_token_id: int = 0, generator: torch.Generator | None = None) -> Rollout:  # fmt: skip
        rows = [self.tokenizer("Score: 7")["input_ids"] for _ in prompts]
        return Rollout.from_rows(rows, [torch.zeros(len(r)) for r in rows])


class _Hangs(LlamaRolloutEngine):
    """The real engine, whose generate first waits for `release` (at most 60 s): a hung judge."""

    release = threading.Event()

    def generate(self, *args: Any, **kwargs: Any) -> Rollout:
        self.release.wait(60)
        return super().generate(*args, **kwargs)


def _judge(judge_dir: Path, engine_class: type[LlamaRolloutEngine], **settings: Any) -> LocalJudge:
    model, tokenizer = load_pretrained(judge_dir, key="reward.judge.model_path")
    engine = engine_class.reading(model.requires_grad_(False).eval())
    engine.tokenizer = tokenizer  # type: ignore[attr-defined]
    return LocalJudge(JudgeConfig(model_path=str(judge_dir), **settings), tokenizer, engine)


def _verdicts(metrics: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("reward/judge_"): v for k, v in metrics.items() if k in VERDICTS and v}


def test_planted_judges_give_their_verdicts(judge_dir: Path) -> None:
    judge = _judge(judge_dir, _Answers)
    t0 = time.monotonic()
    judged, metrics = judge.judge(["p"] * 4, ["good", "high", "junk", "good"], ["a"] * 4)
    seconds = time.monotonic() - t0
    assert [j.verdict for j in judged] == [JudgeVerdict.OK, JudgeVerdict.OUT_OF_RANGE,
                                           JudgeVerdict.UNPARSEABLE, JudgeVerdict.OK]  # fmt: skip
    assert [j.score for j in judged] == pytest.approx([0.7, 0.0, 0.0, 0.7])
    assert _verdicts(metrics) == {"ok": 2, "out_of_range": 1, "unparseable": 1}
    assert metrics["reward/judge_cache_hits"] == 1  # the repeated (prompt, response, answer)
    _, again = judge.judge(["p"], ["high"], ["a"])
    assert again["reward/judge_cache_hits"] == 1 and _verdicts(again) == {"out_of_range": 1}
    print(f"planted: ok 2, out_of_range 1, unparseable 1 in {seconds:.3f} s")


def test_the_random_model_answers_garbage_unparseable(judge_dir: Path) -> None:
    judge = build_judge(load_config(None, [f"reward.judge.model_path={judge_dir}"]))
    assert isinstance(judge.engine, LlamaRolloutEngine)  # the run's fast engine for a Qwen2
    t0 = time.monotonic()
    judged, metrics = judge.judge(["12345678", "12345678"], ["87654321", "1"], ["87654321"] * 2)
    print(f"random model: unparseable 2 in {time.monotonic() - t0:.3f} s")
    assert [j.verdict for j in judged] == [JudgeVerdict.UNPARSEABLE] * 2 and _verdicts(metrics) == {
        "unparseable": 2
    }


def test_a_hung_judge_times_out_within_the_deadline_and_is_not_piled_up(judge_dir: Path) -> None:
    judge = _judge(judge_dir, _Hangs, timeout_s=1.0)
    _Hangs.release.clear()
    try:
        t0 = time.monotonic()
        judged, metrics = judge.judge(["p", "q"], ["r", "s"], ["a", "b"])
        first = time.monotonic() - t0
        assert first < 1.0 + 1.0 and [j.verdict for j in judged] == [JudgeVerdict.TIMEOUT] * 2
        assert _verdicts(metrics) == {"timeout": 2} and metrics["reward/judge_abandoned"] == 1
        t0 = time.monotonic()  # the abandoned thread still runs: this batch waits for it, no new thread
        judged, metrics = judge.judge(["p"], ["r"], ["a"])  # a timeout is not cached: judged again
        second = time.monotonic() - t0
        assert second < 1.0 + 1.0 and _verdicts(metrics) == {"timeout": 1}
        assert metrics["reward/judge_abandoned"] == 0 and metrics["reward/judge_cache_hits"] == 0
    finally:
        _Hangs.release.set()
    judged, metrics = judge.judge(["p"], ["r"], ["a"])  # released: the judge decodes again
    assert _verdicts(metrics) == {"unparseable": 1}
    print(f"hung: timeout 2 in {first:.3f} s, then timeout 1 in {second:.3f} s (deadline 1 s)")


# -- training with the judge ----------------------------------------------------------------------

P, N = 4, 4
RUN = [
    f"rollout.prompts_per_step={P}", f"rollout.n_samples_per_prompt={N}", "eval.every=0",
    "eval.num_prompts=8", "checkpoint.save_every=0", "logging.tensorboard=false", "logging.samples_every=1",
    "resources.use_ray=false", "max_steps=2", "reward.judge.weight=0.5",
]  # fmt: skip


@pytest.mark.integration  # training runs
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_steps_with_the_judge_count_every_row(mode: str, judge_dir: Path, tmp_path: Path) -> None:
    from entrepot.grpo.run.samples import SAMPLES_FILE, read_samples
    from entrepot.grpo.trainer import Trainer

    extra = ["trainer.mode=async", "trainer.chunk_tokens=4"] if mode == "async" else []
    trainer = Trainer(load_config(None, [*RUN, *extra, f"reward.judge.model_path={judge_dir}"]), tmp_path)
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == [1, 2]
    counted = [sum(r.get(k, 0.0) for k in VERDICTS) for r in rows]
    if mode == "sync":  # the reward stage scored exactly the step's rows
        assert counted == [P * N, P * N] and all(k in r for r in rows for k in VERDICTS)
    else:  # the rollout scores whole groups as they finish, ahead of the step
        assert sum(counted) >= 2 * P * N and sum(counted) % N == 0
    assert sum(r.get("reward/judge_unparseable", 0.0) for r in rows) == sum(counted)  # a random judge
    samples = read_samples(tmp_path / SAMPLES_FILE)
    assert samples and all(
        s["judge"]["verdict"] == "unparseable" and s["judge"]["score"] == 0.0 for s in samples
    )
    assert all(s["parts"]["judge"] == 0.0 and isinstance(s["judge"]["output"], str) for s in samples)


@pytest.mark.integration  # a trainer's stages
def test_the_judge_adds_its_weighted_score_to_the_verifiers(judge_dir: Path, tmp_path: Path) -> None:
    from entrepot.grpo.data import rewards
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import tensor_text

    trainer = Trainer(load_config(None, [*RUN, f"reward.judge.model_path={judge_dir}"]), tmp_path)
    try:
        worker = trainer.cluster.rewards.workers[0]  # type: ignore[attr-defined]
        worker.judge = _judge(judge_dir, _Seven)  # the reward stage's own judge, answering 7 of 10
        rows, stats = trainer.grpo_step.generate(P, version=0)
        out = trainer.dock.peek(["rm_scores", "responses", "answer", "judge_verdict"], rows, layout="packed")
    finally:
        trainer.close()
    tok = trainer.setup.tokenizer
    responses = [tok.decode(r.tolist(), skip_special_tokens=True)
                 for r in out.columns["responses"].split(out.lengths["responses"].tolist())]  # fmt: skip
    answers = [tensor_text(a) for a in out.columns["answer"].split(out.lengths["answer"].tolist())]
    expected = torch.tensor(rewards.score(responses, answers, {"partial_credit": 1.0})) + 0.5 * 0.7
    torch.testing.assert_close(out.columns["rm_scores"], expected, rtol=0, atol=1e-5)
    assert out.columns["judge_verdict"].tolist() == [0.0] * (P * N)  # ok
    assert sum(s.get("reward/judge_ok", 0.0) for s in stats) == P * N
