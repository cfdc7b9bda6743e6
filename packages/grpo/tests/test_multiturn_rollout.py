"""Multi-turn rollouts: the trajectory is the conversation's tokens as sampled and rendered, its
behaviour log-probs are the trainer's, a failing environment ends only its trajectory, the limits
hold, environment calls overlap, and the built-in calculator and tool helpers answer as documented."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.config import ModelConfig
from entrepot.grpo.data.tasks import MULTITURN_ALPHABET, CharTokenizer
from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine
from entrepot.grpo.errors import EnvironmentFailure, GRPOConfigError
from entrepot.grpo.multiturn import (
    EndReason,
    Environment,
    MultiTurnConfig,
    MultiTurnRollout,
    Row,
    Step,
    ToolCall,
    ToolEnvironment,
    Trajectory,
    load_environment,
    stop_token_ids,
)
from entrepot.grpo.multiturn.calculator import ERROR, CalculatorEnv, add
from entrepot.grpo.multiturn.chat import CharChat
from entrepot.grpo.multiturn.env_calls import EnvCalls
from entrepot.grpo.multiturn.environment import step_problem
from entrepot.grpo.multiturn.tools import MAX_TOOL_CALLS, TOOL_CALLS, parse_hermes_call, run_tool

TOKENIZER = CharTokenizer(MULTITURN_ALPHABET)
EOS = TOKENIZER.eos_token_id
PROMPTS = ["12+34=", "5+6=", "987+3=", "1+1="]


def _model_and_engine() -> tuple[torch.nn.Module, GPT2RolloutEngine]:
    """A tiny random GPT-2 and an engine holding the same weights (init_std 0.3: a peaky policy)."""
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(init_std=0.3, max_positions=128), TOKENIZER.vocab_size, pad_token_id=0, eos_token_id=EOS
    ).eval()
    engine = GPT2RolloutEngine.from_hf_config(model.config)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    return model, engine


@pytest.fixture(scope="module")
def model_and_engine() -> tuple[torch.nn.Module, GPT2RolloutEngine]:
    return _model_and_engine()


def _starts(count: int) -> list[tuple[Row, list[int]]]:
    rows = [Row(PROMPTS[i % len(PROMPTS)], "0", index=10 + i) for i in range(count)]
    return [(row, TOKENIZER.encode(row.prompt)) for row in rows]


def _run(
    engine: GPT2RolloutEngine, factory: Callable[..., Any], count: int = 4, max_new_tokens: int = 6,
    **config: Any,
) -> tuple[list[Trajectory], dict[str, float]]:  # fmt: skip
    rollout = MultiTurnRollout(MultiTurnConfig(environment="test", **config), CharChat(TOKENIZER), factory)
    try:
        return rollout.run(
            engine, _starts(count), SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
            pad_token_id=0, generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
    finally:
        rollout.close()


def _model_turns(traj: Trajectory) -> list[list[int]]:
    """The runs of model-masked tokens: one per model turn (an environment message separates two)."""
    turns: list[list[int]] = []
    previous = False
    for token, mine in zip(traj.tokens, traj.model_mask, strict=True):
        if mine and not previous:
            turns.append([])
        if mine:
            turns[-1].append(token)
        previous = mine
    return turns


class EchoEnv(Environment):
    """Answers ``<row><turn>#`` to the first `turns` model turns, then says done; records every action."""

    def __init__(self, turns: int = 2, reward: float = 1.0) -> None:
        self.turns, self.reward = turns, reward
        self.actions: list[str] = []

    def reset(self, row: Row) -> None:
        self.row = row

    def observation(self, turn: int) -> str:
        return f"{self.row.index}{turn}#"

    def step(self, action: str) -> Step:
        self.actions.append(action)
        if len(self.actions) > self.turns:
            return Step(reward=self.reward, done=True, info={"correct": 1.0})
        return Step(observation=self.observation(len(self.actions)), reward=0.25)


def _recording(cls: Callable[..., Any], **kwargs: Any) -> tuple[Callable[..., Any], list[Any]]:
    """A factory that keeps each environment it makes (in row order: `run` builds them in order)."""
    made: list[Any] = []

    def factory() -> Any:
        made.append(cls(**kwargs))
        return made[-1]

    return factory, made


# -- the trajectory is the conversation ------------------------------------------------------------


def test_trajectory_tokens_are_the_sampled_turns_and_the_rendered_messages(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    factory, envs = _recording(EchoEnv, turns=2)
    trajs, metrics = _run(engine, factory, count=4, max_tokens=64)
    stops: list[bool] = []
    for traj, env, (row, prompt) in zip(trajs, envs, _starts(4), strict=True):
        assert traj.end is EndReason.DONE and traj.turns == 3 and traj.row == row.index
        assert traj.prompt == prompt
        turns = _model_turns(traj)
        assert len(turns) == 3
        # An independent rendering: each turn's sampled tokens, then (after the first two) an eos when
        # the model did not stop, and ">" + message + "=" encoded by the tokenizer.
        tokens: list[int] = []
        mask: list[bool] = []
        for k, turn in enumerate(turns, start=1):
            tokens += turn
            mask += [True] * len(turn)
            if k <= 2:
                stopped = turn[-1] == EOS
                stops.append(stopped)
                rendered = ([] if stopped else [EOS]) + TOKENIZER.encode(">" + env.observation(k) + "=")
                tokens += rendered
                mask += [False] * len(rendered)
        assert traj.tokens == tokens
        assert traj.model_mask == mask
        assert all(lp == 0.0 for lp, mine in zip(traj.logprobs, mask, strict=True) if not mine)
        # The environment read each turn's text: its characters, the special tokens left out.
        assert env.actions == ["".join(MULTITURN_ALPHABET[t - 2] for t in turn if t >= 2) for turn in turns]
        assert traj.reward == pytest.approx(0.25 * 2 + 1.0) and traj.correct
    assert any(stops) and not all(stops)  # both renderings (after a stop and after a cut turn) checked
    assert metrics["multiturn/end_done"] == 4.0 and metrics["multiturn/env_failures"] == 0.0
    assert metrics["multiturn/turns_mean"] == 3.0
    env_tokens = sum(not m for t in trajs for m in t.model_mask)
    all_tokens = sum(len(t.tokens) for t in trajs)
    assert metrics["multiturn/env_token_frac"] == pytest.approx(env_tokens / all_tokens)


def test_behaviour_logprobs_equal_a_fresh_forward_of_the_whole_trajectory(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    model, engine = model_and_engine
    factory, _ = _recording(EchoEnv, turns=2)
    trajs, _ = _run(engine, factory, count=4, max_tokens=64)
    batch = ResponseBatch.from_packed(
        torch.tensor([x for t in trajs for x in t.prompt]), torch.tensor([len(t.prompt) for t in trajs]),
        torch.tensor([x for t in trajs for x in t.tokens]), torch.tensor([len(t.tokens) for t in trajs]),
    )  # fmt: skip
    mask = torch.tensor([m for t in trajs for m in t.model_mask])
    behaviour = torch.tensor([x for t in trajs for x in t.logprobs])
    assert (~mask).any()  # there are environment tokens in the forward pass
    with torch.no_grad():
        for packed in (True, False):
            logp, _ = response_logprobs(model, batch, packed=packed)
            torch.testing.assert_close(behaviour[mask], logp[mask], atol=1e-5, rtol=1e-5)


# -- failures are data ------------------------------------------------------------------------------


class FlakyEnv(Environment):
    """Row 10 is healthy (reward 0.75), row 11 raises, row 12 hangs, row 13 answers a dict, row 14 a
    str in its info, row 15 a NaN verdict with reward 1 (issue 58: a crash, and a false success)."""

    def reset(self, row: Row) -> None:
        self.row = row

    def step(self, action: str) -> Any:
        kind = self.row.index - 10
        if kind == 1:
            raise RuntimeError("the sandbox is gone")
        if kind == 2:
            time.sleep(1.0)
        if kind == 3:
            return {"reward": 1.0, "done": True}
        if kind == 4:
            return Step(reward=1.0, done=True, info={"x": "str"})  # type: ignore[dict-item]
        if kind == 5:
            return Step(reward=1.0, done=True, info={"correct": float("nan")})
        return Step(reward=0.75, done=True)


def test_a_failing_environment_ends_only_its_trajectory(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    t0 = time.perf_counter()
    trajs, metrics = _run(engine, FlakyEnv, count=6, env_timeout_s=0.2)
    assert time.perf_counter() - t0 < 0.9  # the hung call is abandoned, not waited for
    assert [t.end for t in trajs] == [
        EndReason.DONE, EndReason.ENV_ERROR, EndReason.ENV_TIMEOUT, *[EndReason.ENV_MALFORMED] * 3
    ]  # fmt: skip
    assert trajs[0].reward == 0.75
    assert "the sandbox is gone" in trajs[1].detail and "RuntimeError" in trajs[1].detail
    assert "0.2 s" in trajs[2].detail and "dict" in trajs[3].detail
    assert "info['x'] 'str', not a finite number" in trajs[4].detail
    assert "info['correct'] nan, not a finite number" in trajs[5].detail
    assert all(t.turns == 1 for t in trajs) and all(t.reward == 0.0 for t in trajs[1:])
    assert [t.correct for t in trajs] == [False] * 6  # reward 0.75 < 1; the failures are never correct
    assert metrics["multiturn/env_failures"] == 5.0
    assert metrics["multiturn/end_env_error"] == metrics["multiturn/end_env_timeout"] == 1.0
    assert metrics["multiturn/end_env_malformed"] == 3.0 and metrics["multiturn/end_done"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values()) and "env/x" not in metrics


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (Step(reward=1.0, done=True, info={"x": "str"}), "info['x'] 'str', not a finite number"),  # type: ignore[dict-item]
        (Step(done=True, info={"correct": float("nan")}), "info['correct'] nan, not a finite number"),
        (Step(done=True, info={"n": float("inf")}), "info['n'] inf, not a finite number"),
        (Step(done=True, info={"n": None}), "info['n'] None, not a finite number"),  # type: ignore[dict-item]
        (Step(done=True, info={"correct": 0.5}), "info['correct'] 0.5, not 0 or 1"),
        (Step(done=True, info={"correct": 2}), "info['correct'] 2, not 0 or 1"),
        (Step(done=True, info={1: 1.0}), "info key 1, not a str"),  # type: ignore[dict-item]
        (Step(done=True, info=[("x", 1.0)]), "info of type list, not a mapping"),  # type: ignore[arg-type]
        (Step(reward=float("nan"), done=True), "reward nan, not a finite number"),
        (Step(reward="1", done=True), "reward '1', not a finite number"),  # type: ignore[arg-type]
        (Step(done="yes"), "done 'yes', not a bool"),  # type: ignore[arg-type]
        (Step(observation=None), "observation None without done"),
        (Step(observation="x", role=None), "role None, not a str"),  # type: ignore[arg-type]
        ({"reward": 1.0, "done": True}, "a dict, not a Step"),
    ],
)
def test_step_problem_names_the_field_and_value(step: Any, problem: str) -> None:
    assert problem in step_problem(step)


@pytest.mark.parametrize(
    "step",
    [
        Step(observation="7"),
        Step(reward=1, done=True, info={"correct": True, "tool_calls": 2}),  # ints and bools are numbers
        Step(reward=0.5, done=True, info={"correct": 0.0, "score": -3.5}),
    ],
)
def test_a_step_that_keeps_the_contract_has_no_problem(step: Step) -> None:
    assert step_problem(step) == ""


def test_fail_fast_raises_naming_the_dock_row(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    with pytest.raises(EnvironmentFailure, match=r"dock row 11 .*the sandbox is gone"):
        _run(engine, FlakyEnv, count=2, fail_fast=True)


class AsyncEnv:
    """Coroutine methods (any object with reset and step will do): two turns, then done."""

    async def reset(self, row: Row) -> None:
        await asyncio.sleep(0.01)
        self.turn = 0

    async def step(self, action: str) -> Step:
        await asyncio.sleep(0.01)
        self.turn += 1
        return Step(reward=0.5, done=True) if self.turn == 2 else Step(observation="7")


def test_an_async_environment_runs_on_the_event_loop(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    trajs, metrics = _run(engine, AsyncEnv, count=3, max_tokens=64)
    assert [(t.end, t.turns, t.reward) for t in trajs] == [(EndReason.DONE, 2, 0.5)] * 3
    assert metrics["multiturn/env_failures"] == 0.0
    for traj in trajs:
        env_tokens = [x for x, mine in zip(traj.tokens, traj.model_mask, strict=True) if not mine]
        assert env_tokens[-3:] == TOKENIZER.encode(">7=")


# -- limits -----------------------------------------------------------------------------------------


class ChattyEnv(Environment):
    """Never done: answers `observation` to every turn with reward 0.1."""

    def __init__(self, observation: str = "3") -> None:
        self.text = observation

    def step(self, action: str) -> Step:
        return Step(observation=self.text, reward=0.1)


def test_max_turns_ends_the_trajectory(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    trajs, metrics = _run(engine, ChattyEnv, count=3, max_turns=2, max_tokens=64)
    for traj in trajs:
        assert traj.end is EndReason.MAX_TURNS and traj.turns == 2
        assert len(_model_turns(traj)) == 2 and traj.model_mask[-1]  # no message after the last turn
        assert traj.reward == pytest.approx(0.2)
    assert metrics["multiturn/end_max_turns"] == 3.0


def test_a_too_long_observation_ends_the_trajectory_unappended(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    factory = lambda: ChattyEnv("0123456789")  # noqa: E731  ">0123456789=" is 12 tokens (13 after a cut turn)
    trajs, _ = _run(engine, factory, count=3, max_observation_tokens=8, max_tokens=64)
    for traj in trajs:
        assert traj.end is EndReason.OBSERVATION_TOO_LONG and traj.turns == 1
        assert all(traj.model_mask) and len(traj.tokens) <= 6  # the first model turn alone
        assert "max_observation_tokens (8)" in traj.detail


def test_max_tokens_is_never_exceeded(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    trajs, metrics = _run(engine, ChattyEnv, count=8, max_turns=100, max_tokens=20)
    for traj in trajs:
        assert traj.end is EndReason.MAX_TOKENS
        assert len(traj.tokens) <= 20 and traj.turns >= 2
        assert len(traj.tokens) == len(traj.model_mask) == len(traj.logprobs)
    assert metrics["multiturn/end_max_tokens"] == 8.0


# -- environment calls overlap ----------------------------------------------------------------------


class SlowEnv(Environment):
    """Each step sleeps 0.1 s; done after two turns."""

    def reset(self, row: Row) -> None:
        self.turn = 0

    def step(self, action: str) -> Step:
        time.sleep(0.1)
        self.turn += 1
        return Step(done=True, reward=1.0) if self.turn == 2 else Step(observation="1")


def test_environment_calls_run_concurrently(model_and_engine) -> None:  # type: ignore[no-untyped-def]
    _, engine = model_and_engine
    sequential = 8 * 2 * 0.1  # trajectories x turns x seconds per step
    seconds = {}
    for concurrency in (8, 1):
        t0 = time.perf_counter()
        trajs, _ = _run(engine, SlowEnv, count=8, env_concurrency=concurrency, max_tokens=64)
        seconds[concurrency] = time.perf_counter() - t0
        assert all(t.end is EndReason.DONE and t.turns == 2 for t in trajs)
    assert seconds[8] < 0.5 * sequential
    assert seconds[1] >= 0.95 * sequential


# -- loading an environment -------------------------------------------------------------------------


def test_load_environment_resolves_names_and_paths() -> None:
    assert load_environment("calculator") is CalculatorEnv
    for spec in ("test_multiturn_rollout:EchoEnv", "test_multiturn_rollout.EchoEnv"):
        cls = load_environment(spec)  # this folder is importable (conftest), as a user's package is
        env = cls(turns=0, reward=0.5)
        env.reset(Row("1+1=", "2", 0))
        assert cls.__name__ == "EchoEnv"
        assert env.step("2") == Step(reward=0.5, done=True, info={"correct": 1.0})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nonsense", r"built-in environment \(calculator"),
        ("no_such_module_here:Env", "cannot be imported"),
        ("json:NoSuchClass", "cannot be imported"),
        ("math:pi", "must be a class or a function, got float"),
    ],
)
def test_load_environment_refuses_bad_paths(spec: str, message: str) -> None:
    with pytest.raises(GRPOConfigError, match=rf"multiturn\.environment \('{spec}'\).*{message}"):
        load_environment(spec)


# -- the calculator ---------------------------------------------------------------------------------


def _calculator(**kwargs: Any) -> CalculatorEnv:
    env = CalculatorEnv(**kwargs)
    env.reset(Row("12+34=", "046", 0))
    return env


def test_calculator_direct_answer_gets_partial_credit() -> None:
    exact = _calculator().step("046")
    assert exact.done and exact.reward == 1.0 and exact.info == {"tool_calls": 0.0, "correct": 1.0}
    near = _calculator().step("041")  # two of three digits, no call: no bonus
    assert near.done and near.reward == pytest.approx(2 / 3) and near.info["correct"] == 0.0


def test_calculator_call_then_answer() -> None:
    env = _calculator(call_bonus=0.2)
    call = env.step("#")
    assert not call.done and call.role == "tool" and call.observation == "046"  # the question's sum
    assert call.reward == 0.0 and call.info == {"tool_calls": 1.0}
    answer = env.step("046")
    assert answer.done and answer.reward == pytest.approx(1.2) and answer.info["correct"] == 1.0
    assert answer.info["tool_calls"] == 1.0


def test_calculator_adds_the_numbers_of_the_call_and_caps_calls() -> None:
    env = _calculator(max_calls=1, call_bonus=0.5)
    assert env.step("5+7#").observation == "012"  # those numbers, at the answer's width
    second = env.step("#")  # past max_calls: the answer
    assert second.done and second.reward == pytest.approx(0.0 + 0.5) and second.info["correct"] == 0.0
    env = _calculator(max_calls=2)
    env.step("#")
    assert env.step("1+2#").observation == "003"  # a second call, allowed
    assert CalculatorEnv.stop == ("#",)  # the call token ends the model's turn


def test_calculator_answers_an_unreadable_call_with_the_error_mark_and_no_bonus() -> None:
    env = CalculatorEnv()
    env.reset(Row("what", "12", 0))  # no question to fall back on: the tool gets no arguments
    out = env.step("#")
    assert out.observation == ERROR and out.role == "tool" and not out.done
    env = _calculator(call_bonus=0.5)
    assert env.step("7x#").observation == ERROR  # neither '#' alone nor a+b
    assert env.step("046").reward == 1.0  # the call failed: no bonus
    assert _calculator().step("=1").done  # a turn that does not end with '#' is an answer


# -- tool calls -------------------------------------------------------------------------------------


def test_parse_hermes_call() -> None:
    text = 'let me add <tool_call> {"name": "add", "arguments": {"a": 1, "b": 2}} </tool_call> then'
    assert parse_hermes_call(text) == ToolCall("add", {"a": 1, "b": 2})
    assert parse_hermes_call('<tool_call>{"name": "now"}</tool_call>') == ToolCall("now", {})
    assert parse_hermes_call('<tool_call>{"name": "x", "arguments": [1]}</tool_call>') == ToolCall("x", {})
    for malformed in (
        "no call here",
        '<tool_call>{"name": add}</tool_call>',  # not JSON
        '<tool_call>{"name": 3}</tool_call>',  # a name that is not a str
        '<tool_call>{"name": "add"}',  # not closed
    ):
        assert parse_hermes_call(malformed) is None, malformed


def _hang() -> str:
    time.sleep(0.5)
    return "late"


def test_run_tool_answers_errors_and_timeouts_as_text() -> None:
    assert run_tool(add, {"a": 1, "b": 2, "width": 2}, timeout_s=1.0) == "03"
    assert run_tool(lambda: 1 / 0, {}, timeout_s=1.0) == "error: ZeroDivisionError: division by zero"
    assert run_tool(add, {"a": 1}, timeout_s=1.0).startswith("error: TypeError")
    t0 = time.perf_counter()
    assert run_tool(_hang, {}, timeout_s=0.05) == "error: timed out after 0.05 s"
    assert time.perf_counter() - t0 < 0.4


def test_hung_tools_hold_no_slot_and_no_exit_later_calls_still_run() -> None:
    """More hung calls than tool slots: each times out, gives its slot back and is abandoned on a
    daemon thread (which cannot keep the process from exiting); the next call runs at once."""
    release = threading.Event()
    hung_threads: list[threading.Thread] = []

    def hang() -> str:
        hung_threads.append(threading.current_thread())
        release.wait()
        return "late"

    abandoned = TOOL_CALLS.abandoned  # an earlier test's hung call may still be counted, and end
    try:
        for _ in range(MAX_TOOL_CALLS + 4):
            assert run_tool(hang, {}, timeout_s=0.02) == "error: timed out after 0.02 s"
        assert TOOL_CALLS.abandoned >= MAX_TOOL_CALLS + 4
        assert len(hung_threads) == MAX_TOOL_CALLS + 4 and all(t.daemon for t in hung_threads)
        assert run_tool(add, {"a": 1, "b": 2, "width": 2}, timeout_s=5.0) == "03"
    finally:
        release.set()
    for thread in hung_threads:
        thread.join(timeout=5)
    assert TOOL_CALLS.abandoned <= abandoned  # a hung call that returns is no longer counted


def test_a_queued_call_times_out_from_its_start_not_from_its_submit() -> None:
    calls = EnvCalls(1)
    first = calls.submit(time.sleep, 0.2)
    second = calls.submit(lambda: "ran")  # waits ~0.2 s for the slot, then runs at once
    assert calls.result(second, timeout_s=0.1) == "ran"
    assert calls.result(first, timeout_s=1.0) is None and calls.abandoned == 0


class EchoTools(ToolEnvironment):
    """One tool, ``echo``; the answer ``ok`` scores 1."""

    def __init__(self) -> None:
        self.tools = {"echo": lambda text: text}

    def finish(self, answer: str) -> float:
        return float(answer == "ok")


def test_tool_environment_runs_calls_until_an_answer() -> None:
    env = EchoTools()
    env.reset(Row("q", "a", 0))
    out = env.step('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>')
    assert out == Step(observation="hi", role="tool", info={"tool_calls": 1.0})
    unknown = env.step('<tool_call>{"name": "rm"}</tool_call>')
    assert unknown.observation == "error: unknown tool 'rm'; tools: echo" and not unknown.done
    assert env.step("ok") == Step(reward=1.0, done=True, info={"tool_calls": 2.0})


# -- environment stop texts -------------------------------------------------------------------------


class StopsAtHash(EchoEnv):
    """EchoEnv whose model turns end at ``#`` as well (as a tool call ends at its closing tag)."""

    stop = ("#",)


def test_an_environment_stop_text_ends_the_model_turn_and_the_chat_closes_it(
    model_and_engine: tuple[torch.nn.Module, GPT2RolloutEngine],
) -> None:
    _, engine = model_and_engine
    hash_id = TOKENIZER.encode("#")[0]
    assert stop_token_ids(StopsAtHash, TOKENIZER) == (hash_id,)
    rollout = MultiTurnRollout(MultiTurnConfig(environment="test", max_tokens=64), CharChat(TOKENIZER),
                               StopsAtHash, stops=(hash_id,))  # fmt: skip
    try:
        trajectories, _ = rollout.run(
            engine, _starts(16), SamplingParams(temperature=1.0, max_new_tokens=12), pad_token_id=0,
            generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
    finally:
        rollout.close()
    turns = [turn for traj in trajectories for turn in _model_turns(traj)]
    assert all(hash_id not in turn[:-1] for turn in turns)  # nothing sampled past a '#'
    after_hash = [  # the token after each turn that ended at a '#'
        traj.tokens[t + 1]
        for traj in trajectories
        for t in range(len(traj.tokens) - 1)
        if traj.model_mask[t] and not traj.model_mask[t + 1] and traj.tokens[t] == hash_id
    ]
    assert after_hash and set(after_hash) == {EOS}  # the message opens with the <eos> the turn lacked


def test_a_stop_text_of_several_tokens_is_refused_naming_the_key() -> None:
    class TwoTokens(EchoEnv):
        stop = ("##",)

    with pytest.raises(GRPOConfigError, match=r"multiturn\.environment: its stop text '##' is 2 tokens"):
        stop_token_ids(TwoTokens, TOKENIZER)
