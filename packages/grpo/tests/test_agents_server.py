"""The agent server on a real engine (the embedded default's GPT-2, tiny and random): the `openai` client
gets completions with the sampled ids, log-probs and policy version; every bad input is a JSON 4xx
(malformed JSON, unknown model, no or a wrong token, over the budget, out-of-range parameters, stream);
an edited history is 409; nothing answers between rollouts (503) or after close; and `AgentRollout`
turns agent code into trajectories whose tokens are exactly the sampled ones."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch

from entrepot.grpo.agents import load_agent
from entrepot.grpo.agents.examples import calculate, calculator_agent
from entrepot.grpo.agents.rollout import AgentRollout
from entrepot.grpo.agents.server import AgentServer
from entrepot.grpo.agents.serving import Serving
from entrepot.grpo.config import ModelConfig
from entrepot.grpo.data.tasks import MULTITURN_ALPHABET, CharTokenizer
from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine
from entrepot.grpo.errors import GRPOConfigError
from entrepot.grpo.multiturn import EndReason, MultiTurnConfig, Row
from entrepot.grpo.multiturn.chat import CharChat

TOKENIZER = CharTokenizer(MULTITURN_ALPHABET)
EOS = TOKENIZER.eos_token_id
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS,))
CONFIG = MultiTurnConfig(agent="entrepot.grpo.agents.examples:calculator_agent", max_tokens=40)


@pytest.fixture(scope="module")
def engine() -> GPT2RolloutEngine:
    torch.manual_seed(0)
    model = build_model(ModelConfig(init_std=0.3, max_positions=128), TOKENIZER.vocab_size, pad_token_id=0,
                        eos_token_id=EOS).eval()  # fmt: skip
    engine = GPT2RolloutEngine.from_hf_config(model.config)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    return engine


@pytest.fixture
def server(engine: GPT2RolloutEngine) -> Iterator[AgentServer]:
    """A server open to new sessions, serving `engine` as policy version 7."""
    serving = Serving()
    server = AgentServer(serving, CharChat(TOKENIZER), TOKENIZER, CONFIG, open_sessions=True,
                         max_prompt_tokens=16).start()  # fmt: skip
    serving.attach(engine, SAMPLING, pad_token_id=0, generator=torch.Generator().manual_seed(1), version=7)
    yield server
    server.close()


def _client(server: AgentServer, session: str = "s1") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(session), api_key=server.token, max_retries=0)


def _post(server: AgentServer, route: str, body: Any, *, token: str | None = None, session: str = "s1",
          raw: bytes | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """POST to the server as any HTTP client would; (status, JSON body)."""
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "X-Session-Id": session}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/{route}", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_openai_client_gets_completions_with_their_sampled_ids(server: AgentServer) -> None:
    client = _client(server)
    assert [m.id for m in client.models.list()] == ["policy"]
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "12+34="}],
                                           stop=["#"])  # fmt: skip
    extension = reply.model_extra["entrepot"]  # type: ignore[index]
    ids = extension["token_ids"]
    assert 1 <= len(ids) <= SAMPLING.max_new_tokens and len(extension["logprobs"]) == len(ids)
    assert all(lp <= 0 for lp in extension["logprobs"]) and extension["policy_version"] == 7
    assert reply.choices[0].message.content == TOKENIZER.decode(ids, skip_special_tokens=True)
    assert (
        reply.usage is not None
        and reply.usage.prompt_tokens == 6
        and reply.usage.completion_tokens == len(ids)
    )
    assert server.sessions["s1"].turns[0].context == TOKENIZER.encode("12+34=")
    text = _client(server, "s2").completions.create(model="policy", prompt="5+6=", max_tokens=2)
    assert len(text.model_extra["entrepot"]["token_ids"]) <= 2  # type: ignore[index]
    status, body = _post(server, "completions/tokens", {"model": "policy", "prompt_token_ids": [5, 6, 7]},
                         token=server.token, session="s3")  # fmt: skip
    assert status == 200 and body["entrepot"]["token_ids"] and body["object"] == "text_completion"


def test_the_next_turn_continues_the_recorded_tokens_and_an_edited_history_is_409(
    server: AgentServer,
) -> None:
    client = _client(server)
    messages: list[Any] = [{"role": "user", "content": "12+34="}]
    first = client.chat.completions.create(model="policy", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "tool", "content": "46"},
    ]
    client.chat.completions.create(model="policy", messages=messages)
    turns = server.sessions["s1"].turns
    first_ids = first.model_extra["entrepot"]["token_ids"]  # type: ignore[index]
    closing = [] if first_ids[-1] == EOS else [EOS]
    assert turns[1].context == [*turns[0].context, *first_ids, *closing, *TOKENIZER.encode(">46=")]
    edited = [messages[0], {"role": "assistant", "content": "9999"}, messages[2]]
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="policy", messages=edited)
    error = caught.value.body
    assert error["type"] == "history_mismatch" and error["turn"] == 0  # type: ignore[index]
    assert error["first_differing_token"] == 6  # type: ignore[index]  # right after the prompt
    status, body = _post(server, "chat/completions", {"model": "policy", "messages": messages[:1]},
                         token=server.token)  # fmt: skip
    assert status == 409 and body["error"]["type"] == "history_mismatch"  # a dropped turn too


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "1+1="}]}, 404, "model"),
        (
            {"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "temperature": 0},
            400,
            "temperature",
        ),
        (
            {"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "temperature": 0.5},
            400,
            "temperature",
        ),
        (
            {"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 0},
            400,
            "max_tokens",
        ),
        (
            {"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "stream": True},
            400,
            "stream",
        ),
        ({"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "stop": ["##"]}, 400, "stop"),
    ],
    ids=[
        "unknown-model",
        "temperature-0",
        "temperature-not-the-runs",
        "max-tokens-0",
        "stream",
        "stop-two-tokens",
    ],
)
def test_bad_parameters_are_json_4xx_naming_them(
    server: AgentServer, body: dict, status: int, param: str
) -> None:
    got, answer = _post(server, "chat/completions", body, token=server.token)
    assert got == status and answer["error"]["param"] == param, answer


def test_bad_requests_are_json_4xx(server: AgentServer) -> None:
    ok = {"model": "policy", "messages": [{"role": "user", "content": "1+1="}]}
    assert _post(server, "chat/completions", ok)[0] == 401  # no token
    assert (
        _post(server, "chat/completions", ok, token="guessed")[1]["error"]["type"] == "authentication_error"
    )
    status, body = _post(server, "chat/completions", None, token=server.token, raw=b"{not json")
    assert status == 400 and "not JSON" in body["error"]["message"]
    long = {"model": "policy", "messages": [{"role": "user", "content": "1+" * 20 + "1="}]}
    status, body = _post(server, "chat/completions", long, token=server.token, session="long")
    assert status == 400 and body["error"]["type"] == "context_length_exceeded"
    bad = {"model": "policy", "messages": [{"role": "user", "content": "hello"}]}  # not in the alphabet
    assert _post(server, "chat/completions", bad, token=server.token, session="b")[0] == 400
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url("x"), api_key="wrong", max_retries=0).models.list()


def test_nothing_is_served_between_rollouts_or_after_close(server: AgentServer) -> None:
    ok = {"model": "policy", "messages": [{"role": "user", "content": "1+1="}]}
    server.serving.detach()
    status, body = _post(server, "chat/completions", ok, token=server.token)
    assert status == 503 and "no rollout is running" in body["error"]["message"]
    server.close()
    with pytest.raises(openai.APIConnectionError):
        _client(server).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1+1="}]
        )


def test_the_agent_rollout_trains_on_the_tokens_the_agent_was_served(engine: GPT2RolloutEngine) -> None:
    """The example calculator agent: each trajectory is its session's turns, the tool's tokens masked."""
    rollout = AgentRollout(CONFIG, CharChat(TOKENIZER), TOKENIZER, calculator_agent)
    try:
        starts = [
            (Row(p, a, i), TOKENIZER.encode(p))
            for i, (p, a) in enumerate([("12+34=", "046"), ("5+6=", "11")])
        ]
        generator = torch.Generator().manual_seed(0)
        trajectories, metrics = rollout.run(engine, starts * 4, SAMPLING, pad_token_id=0, generator=generator)
    finally:
        rollout.close()
    assert metrics["multiturn/trajectories"] == 8 and metrics["multiturn/env_failures"] == 0
    assert metrics["agents/requests"] >= 8 and metrics["rollout_tokens"] == sum(
        sum(t.model_mask) for t in trajectories
    )
    for traj in trajectories:
        assert traj.end is EndReason.DONE and 1 <= traj.turns <= 2 and traj.reward >= 0
        assert len(traj.tokens) == len(traj.model_mask) == len(traj.logprobs)
        masked = [tok for tok, mine in zip(traj.tokens, traj.model_mask, strict=True) if not mine]
        if traj.turns == 2:  # the tool's message, as the character chat format writes it
            assert TOKENIZER.decode(masked).startswith(">") and TOKENIZER.decode(masked).endswith("=")


def test_a_failing_or_slow_agent_ends_only_its_trajectory(engine: GPT2RolloutEngine) -> None:
    async def flaky(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": row["prompt"]}]
        )
        if row["index"] == 1:
            raise RuntimeError("the agent's bug")
        if row["index"] == 2:
            import asyncio

            await asyncio.sleep(30)
        return 1.0

    config = MultiTurnConfig(agent="x:y", agent_timeout_s=2.0)
    rollout = AgentRollout(config, CharChat(TOKENIZER), TOKENIZER, flaky)
    try:
        starts = [(Row("1+1=", "2", i), TOKENIZER.encode("1+1=")) for i in range(3)]
        trajectories, metrics = rollout.run(engine, starts, SAMPLING, pad_token_id=0)
    finally:
        rollout.close()
    assert [t.end for t in trajectories] == [EndReason.DONE, EndReason.AGENT_ERROR, EndReason.AGENT_TIMEOUT]
    assert "the agent's bug" in trajectories[1].detail and trajectories[1].turns == 1
    assert metrics["multiturn/env_failures"] == 2 and metrics["multiturn/end_agent_timeout"] == 1
    assert not trajectories[1].correct and trajectories[0].reward == 1.0


def test_the_agent_path_and_its_exclusivity_are_checked_naming_the_key() -> None:
    with pytest.raises(GRPOConfigError, match=r"multiturn.agent .*cannot be imported"):
        load_agent("entrepot.grpo.agents.examples:nope")
    with pytest.raises(GRPOConfigError, match=r"multiturn.agent .*must be an async function"):
        load_agent("entrepot.grpo.agents.examples:calculate")
    with pytest.raises(GRPOConfigError, match=r"multiturn.agent .*not both"):
        MultiTurnConfig(agent="a:b", environment="calculator")
    with pytest.raises(GRPOConfigError, match=r"multiturn.agent_timeout_s"):
        MultiTurnConfig(agent="a:b", agent_timeout_s=0)
    assert calculate("#", "12+34=", 3) == "046" and calculate("1+2#", "12+34=", 3) == "003"
    assert calculate("x#", "12+34=", 3) == "?"


def test_the_preflight_imports_the_agent_before_the_run() -> None:
    from entrepot.grpo import load_config
    from entrepot.grpo.run.preflight import check_inputs

    with pytest.raises(
        GRPOConfigError, match=r"multiturn.agent \('no_such_pkg.agents:solve'\) cannot be imported"
    ):
        overrides = [
            "multiturn.agent=no_such_pkg.agents:solve",
            "multiturn.max_tokens=24",
            "data.num_digits=4",
        ]
        check_inputs(load_config(None, overrides))


@pytest.mark.integration  # a fresh interpreter
def test_a_run_without_an_agent_imports_no_server_package() -> None:
    """The agents extra (FastAPI, uvicorn, openai) is needed only with multiturn.agent: the workers, the
    preflight and the trainer import without it, and the preflight's refusal names the install command."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('fastapi', 'uvicorn', 'openai', 'starlette'): sys.modules[name] = None\n"
        "import entrepot.grpo.workers.actor, entrepot.grpo.asynchronous.worker, entrepot.grpo.trainer\n"
        "import importlib.util\n"
        "importlib.util.find_spec = lambda name, *a: None\n"
        "from entrepot.grpo.agents import check_server_installed\n"
        "try:\n"
        "    check_server_installed()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "GRPOConfigError multiturn.agent serves the policy over HTTP" in done.stdout
    assert 'pip install "./packages/grpo[agents]"' in done.stdout
