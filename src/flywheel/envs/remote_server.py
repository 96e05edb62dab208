"""The env-server: `CodingEnv` sessions (reset, step, grade) over HTTP, for trainers that run elsewhere.

    FLYWHEEL_ENV_TOKEN=secret flywheel env-server --port 8780 [--config env.toml] [--tasks tasks.jsonl]
    # a rollout worker: env.remote_url = "http://host:8780" (token from $FLYWHEEL_ENV_TOKEN)

    server = EnvServer(cfg.env, cache_dir, token="secret")        # in-process (tests, benchmarks)
    url = server.start()                                          # a background thread; server.stop()

Why: environments often live on the customer's side (their repositories, their services) while the trainer runs
elsewhere. The server runs the very same `CodingEnv` as a local rollout (sandbox, harness, grading, services), so
a session's observations and reward do not depend on where it ran. The server's own env config is authoritative
(its limits, its reward); a client whose tool set or system prompt differs is refused at `reset`.

API (JSON; every route but /v1/health needs ``Authorization: Bearer TOKEN``, compared in constant time):

| route | body | answer |
|---|---|---|
| GET /v1/health | | `{"ok": true}` |
| GET /v1/info | | the env config, tool names, sessions open |
| POST /v1/sessions | `{"task_id": ..., "task": {flywheel task}}` | `{"session", "messages", "tools", "system_prompt"}` |
| POST /v1/sessions/{id}/step | `{"tool_calls": [...], "errors": [...]}` | `{"messages", "done"}` |
| POST /v1/sessions/{id}/grade | | `{"reward", "metrics"}` |
| DELETE /v1/sessions/{id} | | `{"closed": true}` |

Started with `--tasks FILE`, a session's task is looked up by `task_id` (404 if unknown; the task body is not
used): tasks then never leave the server's side. Without it the client's task (a flywheel task object) is
parsed and checked like a task file line (400 with the reason when broken).
Bounds: bodies over `max_body_mb` get 413; a body not received within `body_timeout_s` 408; more than
`max_sessions` open sessions 503; a second request on a session while one is in flight 409; a session
untouched for `idle_timeout_s` is closed (its sandbox and services with it: a client that died leaks nothing).
Bad JSON or fields 400, a wrong token 401, an unknown session 404; the env failing (sandbox, services, grading)
500 with the reason. Each session's work runs on a thread of its own pool, so one slow test run never
stalls the event loop or other sessions. Tests: `pytest tests/integration/test_env_server.py`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from flywheel.background import BackgroundLoop
from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.tools import tools_for
from flywheel.envs.wire import calls_from_json, message_to_json, reward_to_json
from flywheel.tasks.loaders import BrokenTask, parse_flywheel
from flywheel.types import Task

API = "/v1"


@dataclass
class _Session:
    env: CodingEnv
    task_id: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


def _tool_names(cfg: EnvConfig) -> list[str]:
    return [t["name"] for t in tools_for(cfg)]


class EnvServer:
    """Sessions of `CodingEnv(cfg, cache_dir)` served over HTTP; see the module docstring."""

    def __init__(self, cfg: EnvConfig, cache_dir: str | Path, token: str, *, tasks: dict[str, Task] | None = None,
                 host: str = "127.0.0.1", port: int = 0, max_sessions: int = 64, idle_timeout_s: float = 600.0,
                 max_body_mb: float = 32.0, body_timeout_s: float = 60.0, sandbox_kind: str = "auto") -> None:
        if not isinstance(token, str) or len(token) < 8:
            raise ValueError("the env-server needs a token of at least 8 characters (set FLYWHEEL_ENV_TOKEN or "
                             "pass --token-file)")
        if max_sessions < 1 or idle_timeout_s <= 0 or max_body_mb <= 0 or body_timeout_s <= 0:
            raise ValueError("max_sessions, idle_timeout_s, max_body_mb and body_timeout_s must be positive")
        self.cfg, self.cache_dir, self.token = cfg, Path(cache_dir), token
        self.tasks = tasks
        self.host, self.port = host, port
        self.max_sessions, self.idle_timeout_s = max_sessions, idle_timeout_s
        self.max_body_bytes, self.body_timeout_s = int(max_body_mb * 1024 * 1024), body_timeout_s
        self.sandbox_kind = sandbox_kind
        self.sessions: dict[str, _Session] = {}
        self.counters = {"sessions": 0, "steps": 0, "grades": 0, "env_errors": 0, "reaped": 0}
        self._pool = ThreadPoolExecutor(max_workers=max_sessions + 4, thread_name_prefix="env-server")
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task | None = None
        self._background = BackgroundLoop("env-server")
        self.url = ""

    # --- plumbing
    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _body(self, request: web.Request) -> Any:
        try:
            raw = await asyncio.wait_for(request.read(), self.body_timeout_s)
        except TimeoutError:
            raise web.HTTPRequestTimeout(text=_err(f"request body not received within {self.body_timeout_s:g}s"),
                                         content_type="application/json") from None
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise _bad(f"the body is not JSON: {err}") from None

    def _session(self, request: web.Request) -> _Session:
        sid = request.match_info["sid"]
        s = self.sessions.get(sid)
        if s is None:
            raise web.HTTPNotFound(text=_err(f"no session {sid!r} (closed, reaped after {self.idle_timeout_s:g}s idle, "
                                             "or never opened)"), content_type="application/json")
        return s

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.path != f"{API}/health":
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
                raise web.HTTPUnauthorized(text=_err("missing or wrong token: send 'Authorization: Bearer TOKEN'"),
                                           content_type="application/json")
        return await handler(request)

    # --- routes
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response({"env": self.cfg.model_dump(mode="json"), "tools": _tool_names(self.cfg),
                                  "num_sessions": len(self.sessions), "max_sessions": self.max_sessions,
                                  "tasks": None if self.tasks is None else len(self.tasks), **self.counters})

    def _task_of(self, body: Any) -> Task:
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object with 'task_id' and/or 'task'")
        if self.tasks is not None:
            tid = body.get("task_id")
            if not isinstance(tid, str):
                raise _bad("this server serves its own task file: send 'task_id' (a string)")
            if tid not in self.tasks:
                raise web.HTTPNotFound(text=_err(f"unknown task_id {tid!r}"), content_type="application/json")
            return self.tasks[tid]
        d = body.get("task")
        if not isinstance(d, dict):
            raise _bad("send 'task': a flywheel task object (this server has no task file of its own)")
        try:
            return parse_flywheel(d)
        except (BrokenTask, TypeError, ValueError) as err:
            raise _bad(f"broken task: {err}") from None

    async def _open(self, request: web.Request) -> web.Response:
        task = self._task_of(await self._body(request))
        if len(self.sessions) >= self.max_sessions:
            raise web.HTTPServiceUnavailable(text=_err(f"{self.max_sessions} sessions open; retry later"),
                                             content_type="application/json", headers={"Retry-After": "1"})
        env = CodingEnv(self.cfg, self.cache_dir, self.sandbox_kind)
        sid = secrets.token_hex(16)
        self.sessions[sid] = _Session(env, task.id)  # counted at once: concurrent opens see the bound
        try:
            messages = await self._in_pool(env.reset, task)
        except Exception as err:  # noqa: BLE001 - the env broke (sandbox, services): the client's env failure
            self.sessions.pop(sid, None)
            await self._in_pool(env.close)
            self.counters["env_errors"] += 1
            raise _failed(f"reset failed for task {task.id!r}: {err}") from None
        self.counters["sessions"] += 1
        return web.json_response({"session": sid, "messages": [message_to_json(m) for m in messages],
                                  "tools": _tool_names(self.cfg), "system_prompt": self.cfg.system_prompt})

    async def _step(self, request: web.Request) -> web.Response:
        s = self._session(request)
        try:
            calls, errors = calls_from_json(await self._body(request))
        except ValueError as err:
            raise _bad(str(err)) from None
        async with self._exclusive(s):
            try:
                obs, done = await self._in_pool(s.env.step, calls, errors)
            except Exception as err:  # noqa: BLE001
                self.counters["env_errors"] += 1
                raise _failed(f"step failed: {err}") from None
        self.counters["steps"] += 1
        return web.json_response({"messages": [message_to_json(m) for m in obs], "done": done})

    async def _grade(self, request: web.Request) -> web.Response:
        s = self._session(request)
        async with self._exclusive(s):
            try:
                reward = await self._in_pool(s.env.grade)
                metrics = s.env.metrics()
            except Exception as err:  # noqa: BLE001
                self.counters["env_errors"] += 1
                raise _failed(f"grading failed: {err}") from None
        self.counters["grades"] += 1
        return web.json_response({"reward": reward_to_json(reward), "metrics": metrics})

    async def _close(self, request: web.Request) -> web.Response:
        s = self._session(request)
        self.sessions.pop(request.match_info["sid"], None)
        async with s.lock:  # after a request in flight
            await self._in_pool(s.env.close)
        return web.json_response({"closed": True})

    def _exclusive(self, s: _Session) -> _Exclusive:
        return _Exclusive(s)

    async def _reap(self) -> None:
        """Close sessions idle past `idle_timeout_s` (their client died or forgot them)."""
        while True:
            await asyncio.sleep(min(5.0, self.idle_timeout_s / 4))
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if now - s.last_used > self.idle_timeout_s and not s.lock.locked():
                    self.sessions.pop(sid, None)
                    self.counters["reaped"] += 1
                    await self._in_pool(s.env.close)

    # --- lifecycle
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=self.max_body_bytes)
        app.add_routes([web.get(f"{API}/health", self._health), web.get(f"{API}/info", self._info),
                        web.post(f"{API}/sessions", self._open), web.post(f"{API}/sessions/{{sid}}/step", self._step),
                        web.post(f"{API}/sessions/{{sid}}/grade", self._grade),
                        web.delete(f"{API}/sessions/{{sid}}", self._close)])
        return app

    async def start_async(self) -> str:
        # keep-alive as long as a session may sit idle: the model may think for minutes between two steps
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=self.idle_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://{self.host}:{self.port}"
        self._reaper = asyncio.create_task(self._reap())
        return self.url

    async def stop_async(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        for sid in list(self.sessions):
            s = self.sessions.pop(sid)
            await self._in_pool(s.env.close)

    async def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        await self.start_async()
        if on_ready is not None:
            on_ready(self.url)
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop_async()
            self._pool.shutdown(wait=False)

    def start(self) -> str:
        """Serve from a background thread (tests, benchmarks); returns the URL."""
        return self._background.start(self.start_async, self.stop_async)

    def stop(self) -> None:
        self._background.stop()
        self._pool.shutdown(wait=False)


class _Exclusive:
    """One request at a time per session: a second one while the first runs gets 409."""

    def __init__(self, s: _Session) -> None:
        self.s = s

    async def __aenter__(self) -> None:
        if self.s.lock.locked():
            raise web.HTTPConflict(text=_err("a request of this session is in flight; wait for its answer"),
                                   content_type="application/json")
        await self.s.lock.acquire()
        self.s.last_used = time.monotonic()

    async def __aexit__(self, *exc: object) -> None:
        self.s.last_used = time.monotonic()
        self.s.lock.release()


def _err(message: str) -> str:
    return json.dumps({"error": message})


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=_err(message), content_type="application/json")


def _failed(message: str) -> web.HTTPInternalServerError:
    return web.HTTPInternalServerError(text=_err(message), content_type="application/json")
