"""The env-server's client: `RemoteEnv` has CodingEnv's methods, and the rollout worker drives it the same way.

    factory = env_factory(cfg.env, cache_dir, kind)       # RemoteEnv when env.remote_url is set, else CodingEnv
    env = factory()                                        # each call: the next server, round-robin
    messages = env.reset(task); obs, done = env.step(calls, errors); reward = env.grade(); env.close()

Why a drop-in: the agent loop (rollout/agent.py) calls reset/step/grade/close through `asyncio.to_thread` and turns
any exception into an `EnvironmentFailure`, which the worker retries (the next `factory()` call is the next server)
and, past `rollout.max_env_retries`, records with no reward. So this client raises `RemoteEnvError` for everything
that is not a well-formed answer: a refused or reset connection (a dead server), no answer within the request's
bound (a stalled one: `env.remote_timeout_s` beyond the work the request may do), an HTTP error, a body that is not
the expected JSON, a reward that does not parse (`wire.reward_from_json`). A dead or slow server is never a reward.

Plain `http.client` on one keep-alive connection per session: the calls come from worker threads, and a request
costs well under a millisecond of client CPU. The token comes from the environment variable named by
`env.remote_token_env`. Tests: `pytest tests/integration/test_env_server.py`.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.tools import tools_for
from flywheel.envs.wire import call_to_json, error_to_json, messages_from_json, reward_from_json
from flywheel.tasks.loaders import task_to_dict
from flywheel.types import Message, Reward, Task, ToolCall, ToolCallError

API = "/v1"
COOLDOWN_S = 30.0  # a server that failed is skipped this long while another one is healthy


class RemoteEnvError(RuntimeError):
    """The env-server failed, stalled or answered something that is not a valid answer: an environment failure."""


class RemoteEnv:
    """One session at a time on the env-server at `url` (see the module docstring)."""

    def __init__(self, cfg: EnvConfig, url: str, token: str, *,
                 on_failure: Callable[[str], None] | None = None) -> None:
        """`on_failure(url)` is called when the server fails to answer (the factory then prefers another)."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"env-server URL {url!r} must be http(s)://host:port")
        self.cfg, self.url, self.token = cfg, url.rstrip("/"), token
        self.tools = tools_for(cfg)
        self._parsed = parsed
        self._conn: http.client.HTTPConnection | None = None
        self.session: str | None = None
        self.task: Task | None = None
        self.done = False
        self.reward: Reward | None = None
        self._metrics: dict[str, float] = {}
        self._num_calls = 0
        self._on_failure = on_failure

    # --- transport
    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._parsed.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._parsed.hostname or "", self._parsed.port, timeout=timeout_s)
        self._conn.timeout = timeout_s
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout_s)
        return self._conn

    def _request(self, method: str, path: str, body: Any, timeout_s: float) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            try:
                reused = self._conn is not None and self._conn.sock is not None
                conn = self._connection(timeout_s)
                conn.request(method, API + path, body=data, headers=headers)
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                self._drop()  # the server closed an idle keep-alive connection before reading this: once more
                conn = self._connection(timeout_s)
                conn.request(method, API + path, body=data, headers=headers)
                resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, garbled
            self._drop()
            if self._on_failure is not None:
                self._on_failure(self.url)
            kind = f"did not answer within {timeout_s:.3g}s" if isinstance(err, TimeoutError) else "failed"
            raise RemoteEnvError(f"env-server {self.url} {kind} ({method} {path}): {err!r}") from err
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = None
        if resp.status >= 500 and self._on_failure is not None:
            self._on_failure(self.url)
        if resp.status != 200:
            why = payload.get("error") if isinstance(payload, dict) else raw[:300].decode(errors="replace")
            raise RemoteEnvError(f"env-server {self.url} answered {resp.status} to {method} {path}: {why}")
        if not isinstance(payload, dict):
            raise RemoteEnvError(f"env-server {self.url} answered {method} {path} with something that is not a "
                                 "JSON object")
        return payload

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- the Env protocol
    def reset(self, task: Task) -> list[Message]:
        self.close()
        # the server may start services first (a database: seconds) and materialise the task's workspace
        payload = self._request("POST", "/sessions", {"task_id": task.id, "task": task_to_dict(task)},
                                self.cfg.remote_timeout_s + 60.0)
        sid = payload.get("session")
        if not isinstance(sid, str) or not sid:
            raise RemoteEnvError(f"env-server {self.url} opened no session")
        self.session, self.task, self.done, self.reward = sid, task, False, None
        self._metrics, self._num_calls = {}, 0
        theirs = (payload.get("tools"), payload.get("system_prompt"))
        ours = ([t["name"] for t in self.tools], self.cfg.system_prompt)
        if theirs != (ours[0], ours[1]):
            raise RemoteEnvError(f"env-server {self.url} offers tools {theirs[0]} with system prompt {theirs[1]!r}, "
                                 f"this run's chat format {ours[0]} with {ours[1]!r}: set env.tools and "
                                 "env.system_prompt alike on both sides")
        try:
            return messages_from_json(payload.get("messages"))
        except ValueError as err:
            raise RemoteEnvError(f"env-server {self.url}: bad reset answer: {err}") from None

    def step(self, tool_calls: list[ToolCall], errors: list[ToolCallError] | tuple = ()) -> tuple[list[Message], bool]:
        if self.session is None:
            raise RuntimeError("call reset(task) before step()")
        bound = self.cfg.command_timeout_s * max(1, len(tool_calls)) + self.cfg.remote_timeout_s
        payload = self._request("POST", f"/sessions/{self.session}/step",
                                {"tool_calls": [call_to_json(c) for c in tool_calls],
                                 "errors": [error_to_json(e) for e in errors]}, bound)
        done = payload.get("done")
        if not isinstance(done, bool):
            raise RemoteEnvError(f"env-server {self.url}: bad step answer ('done' is not a boolean)")
        try:
            obs = messages_from_json(payload.get("messages"))
        except ValueError as err:
            raise RemoteEnvError(f"env-server {self.url}: bad step answer: {err}") from None
        self._num_calls += len(tool_calls)
        self.done = self.done or done
        return obs, done

    def grade(self) -> Reward:
        if self.session is None:
            raise RuntimeError("call reset(task) before grade()")
        if self.reward is None:
            payload = self._request("POST", f"/sessions/{self.session}/grade", None,
                                    self.cfg.grade_timeout_s + self.cfg.remote_timeout_s)
            try:
                reward = reward_from_json(payload.get("reward"))
            except ValueError as err:
                raise RemoteEnvError(f"env-server {self.url}: bad reward: {err}") from None
            m = payload.get("metrics", {})
            if isinstance(m, dict):
                self._metrics = {k: float(v) for k, v in m.items()
                                 if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.reward = reward
        return self.reward

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics) if self._metrics else {"num_tool_calls": float(self._num_calls)}

    def close(self) -> None:
        """Close the session on the server; never raises (a dead server's idle reaper closes it there)."""
        sid, self.session = self.session, None
        if sid is not None:
            try:
                self._request("DELETE", f"/sessions/{sid}", None, self.cfg.remote_timeout_s)
            except RemoteEnvError:
                pass
        self._drop()

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_token(cfg: EnvConfig) -> str:
    token = os.environ.get(cfg.remote_token_env, "")
    if not token:
        raise ValueError(f"env.remote_url is set but ${cfg.remote_token_env} is empty: export the env-server's token "
                         "there (or name another variable in env.remote_token_env)")
    return token


class ServerChooser:
    """Round-robin over the env-servers, skipping one that failed in the last `cooldown_s` (while another has not):
    a retried session goes elsewhere. A server is tried again after its cool-down (it may have been restarted)."""

    def __init__(self, urls: list[str], cooldown_s: float = COOLDOWN_S) -> None:
        assert urls
        self.urls, self.cooldown_s = list(urls), cooldown_s
        self._next = 0
        self._failed_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def choose(self) -> str:
        with self._lock:
            now = time.monotonic()
            order = [self.urls[(self._next + i) % len(self.urls)] for i in range(len(self.urls))]
            healthy = [u for u in order if now - self._failed_at.get(u, -1e18) > self.cooldown_s]
            url = healthy[0] if healthy else min(order, key=lambda u: self._failed_at[u])
            self._next = (self.urls.index(url) + 1) % len(self.urls)
            return url

    def failed(self, url: str) -> None:
        with self._lock:
            self._failed_at[url] = time.monotonic()


def env_factory(cfg: EnvConfig, cache_dir: str | Path, sandbox_kind: str = "auto", *,
                grader: Any = None) -> Callable[[], CodingEnv | RemoteEnv]:
    """What the rollout worker calls per session: a local `CodingEnv`, or with `env.remote_url` a `RemoteEnv` on the
    next server (`ServerChooser`: round-robin, a server that just failed skipped, so a retry goes elsewhere)."""
    if not cfg.remote_url:
        return lambda: CodingEnv(cfg, cache_dir, sandbox_kind, grader=grader)
    token = remote_token(cfg)
    chooser = ServerChooser(list(cfg.remote_url))
    return lambda: RemoteEnv(cfg, chooser.choose(), token, on_failure=chooser.failed)
