"""The policy behind an OpenAI-compatible HTTP endpoint, on loopback, for agent code during a run.

Routes (each also under ``/sessions/<id>/v1/...``; otherwise the ``X-Session-Id`` header names the
session): ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (a text prompt)
and ``POST /v1/completions/tokens`` (``prompt_token_ids`` in, sampled ids out). Every completion
carries an ``entrepot`` object: the sampled ``token_ids``, their ``logprobs``, the ``policy_version``
that sampled them, the session and the turn. Non-streaming only.

Security: the server binds 127.0.0.1 on a free port, and every request needs the run's bearer token
(`secrets.token_urlsafe`, compared with `hmac.compare_digest`). Every bad input is a JSON error
(``{"error": {"type", "message", ...}}``): 400 malformed or out of range, 401 no or a wrong token,
404 an unknown model or session, 409 an edited history (`sessions`), 503 no rollout running or closed.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from entrepot.grpo.agents.params import parse_request
from entrepot.grpo.agents.render import chat_ids, parse_messages, text_ids, token_ids
from entrepot.grpo.agents.responses import completion_body
from entrepot.grpo.agents.serving import NotServing, Serving
from entrepot.grpo.agents.sessions import RequestRefused, Session, Turn
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.multiturn.chat import ChatFormat

__all__ = ["AgentServer"]

_START_TIMEOUT_S = 30.0
_ROUTES = ("chat/completions", "completions", "completions/tokens")


class AgentServer:
    """Serves `serving`'s engine to agents over HTTP (see the module docstring).

    Args:
        serving: the engine while a rollout runs.
        chat: renders messages after a model turn (`multiturn.chat.chat_format`).
        tokenizer: the policy's tokenizer.
        config: the `multiturn` section: a session's limits (max_turns, max_tokens, max_observation_tokens).
        model: the model name clients pass.
        open_sessions: a request may open a session of a new id (False: only `open_session`'s).
        max_prompt_tokens: the longest prompt a new client session may start with.
    """

    def __init__(
        self,
        serving: Serving,
        chat: ChatFormat,
        tokenizer: Any,
        config: MultiTurnConfig,
        *,
        model: str = "policy",
        open_sessions: bool = False,
        max_prompt_tokens: int = 1024,
    ) -> None:
        self.serving, self.chat, self.tokenizer, self.config = serving, chat, tokenizer, config
        self.model, self.open_sessions, self.max_prompt_tokens = model, open_sessions, max_prompt_tokens
        self.token = secrets.token_urlsafe(32)
        self.sessions: dict[str, Session] = {}
        self.requests = self.refused = 0
        self._lock = threading.Lock()
        self._closed = False
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1") -> AgentServer:
        """Listen on a free port of `host` (loopback) in a daemon thread; returns once it answers.

        A wildcard `host` (every interface) is refused: the token is the only guard, so keep it local."""
        if host in ("", "0.0.0.0", "::"):
            raise ValueError(f"the agent server binds one address, not the wildcard {host!r}")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="entrepot-agent-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent server did not start on {host}:{self.port}")
            time.sleep(0.01)
        return self

    def base_url(self, session: str | None = None) -> str:
        """The ``base_url`` of an OpenAI client (of `session`, as a path, when given)."""
        prefix = f"/sessions/{session}" if session is not None else ""
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def close(self) -> None:
        """Refuse every request (503), then stop listening."""
        self._closed = True
        self.serving.close()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    # -- sessions -------------------------------------------------------------------------------

    def open_session(
        self, session: str, prompt: list[int] | None = None, prompt_text: str | None = None
    ) -> None:
        """Register a session whose first turn continues `prompt` (`prompt_text`: as one user message)."""
        with self._lock:
            self.sessions[session] = Session(prompt=prompt, prompt_text=prompt_text)

    def end_session(self, session: str) -> Session:
        """Close `session` (later requests are refused) and hand back its record."""
        with self._lock:
            record = self.sessions.pop(session)
        with record.lock:
            record.closed = True
        return record

    def _session(self, name: str | None) -> Session:
        if not name:
            raise RequestRefused(
                400,
                "invalid_request_error",
                "name the session: the X-Session-Id header or a /sessions/<id>/v1 base URL",
            )
        with self._lock:
            if name not in self.sessions and self.open_sessions:
                self.sessions[name] = Session()
            if name not in self.sessions:
                raise RequestRefused(404, "session_not_found", f"session {name!r} is not open")
            return self.sessions[name]

    # -- the app --------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.get("/v1/models")
        @app.get("/sessions/{session}/v1/models")
        async def models(request: Request) -> JSONResponse:
            return await self._answer(request, None, None)

        for route in _ROUTES:
            for path in (f"/v1/{route}", f"/sessions/{{session}}/v1/{route}"):
                app.add_api_route(path, self._endpoint(route), methods=["POST"])
        return app

    def _endpoint(self, route: str) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            return await self._answer(request, route, request.path_params.get("session"))

        return endpoint

    async def _answer(self, request: Request, route: str | None, session: str | None) -> JSONResponse:
        try:
            self._authorize(request)
            if self._closed:
                raise RequestRefused(503, "service_unavailable", "the agent server is closed")
            if route is None:
                return JSONResponse(
                    {
                        "object": "list",
                        "data": [{"id": self.model, "object": "model", "owned_by": "entrepot"}],
                    }
                )
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError) as exc:
                raise RequestRefused(400, "invalid_request_error", f"the body is not JSON: {exc}") from None
            name = session or request.headers.get("x-session-id")
            self.requests += 1
            return JSONResponse(await run_in_threadpool(self._complete, route, body, name))
        except RequestRefused as exc:
            self.refused += 1
            return JSONResponse(exc.body(), status_code=exc.status)
        except NotServing as exc:
            return JSONResponse(
                {"error": {"type": "service_unavailable", "message": str(exc)}}, status_code=503
            )

    def _authorize(self, request: Request) -> None:
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.token.encode()):
            raise RequestRefused(
                401, "authentication_error", "a missing or wrong bearer token (the run's api key)"
            )

    def _complete(self, route: str, body: Any, name: str | None) -> dict[str, Any]:
        params = parse_request(
            body, model=self.model, sampling=self.serving.sampling, tokenizer=self.tokenizer
        )
        session = self._session(name)
        kind = {"chat/completions": "chat", "completions": "text", "completions/tokens": "tokens"}[route]
        with session.lock:
            if session.closed:
                raise RequestRefused(409, "session_closed", "the episode of this session has ended")
            if session.kind not in (None, kind):
                raise RequestRefused(
                    400,
                    "invalid_request_error",
                    f"session {name!r} is a {session.kind} session: one route a session",
                )
            ids = self._context(kind, body, session)
            if session.prompt is None and not session.turns and len(ids) > self.max_prompt_tokens:
                raise RequestRefused(
                    400,
                    "context_length_exceeded",
                    f"the prompt is {len(ids)} tokens > {self.max_prompt_tokens}",
                )
            budget = session.check_limits(ids, self.config)
            limit = min(budget, self.serving.sampling.max_new_tokens, params.max_tokens or budget)
            out = self.serving.generate(ids, limit, params.stops)
            text = str(self.chat.action_text(out.token_ids))
            session.kind = kind
            session.record(Turn(ids, out.token_ids, out.logprobs, text, out.version))
            if kind == "text":
                session.text = body["prompt"] + text
            turn = len(session.turns) - 1
        stops = {*self.serving.sampling.stop_token_ids, *self.chat.stop_token_ids, *params.stops}
        finish = "stop" if out.token_ids and out.token_ids[-1] in stops else "length"
        return completion_body(kind, self.model, text, finish, len(ids), name or "", turn, out)

    def _context(self, kind: str, body: dict[str, Any], session: Session) -> list[int]:
        if kind == "chat":
            return chat_ids(session, parse_messages(body.get("messages")), self.chat, self.tokenizer)
        if kind == "text":
            return text_ids(session, body.get("prompt"), self.tokenizer)
        return token_ids(session, body.get("prompt_token_ids"), self.tokenizer)
