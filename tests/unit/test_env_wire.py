"""The env-server's wire format and client against hostile answers: nothing that is not a well-formed reward becomes
one (envs/wire.py, envs/remote_client.py), and the server closes sessions their client abandoned."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.remote_client import RemoteEnv, RemoteEnvError, ServerChooser
from flywheel.envs.remote_server import EnvServer
from flywheel.envs.tools import tools_for
from flywheel.envs.wire import calls_from_json, messages_from_json, reward_from_json, reward_to_json
from flywheel.tasks.synth import generate_tasks
from flywheel.types import Reward

GOOD = reward_to_json(Reward(1.0, {"tests": 1.0}, [], {"t.py::a": "passed"}, []))


@pytest.mark.parametrize("bad", [
    None, [], {"value": "1"}, {**GOOD, "value": True}, {**GOOD, "value": float("nan")}, {**GOOD, "value": 1e400},
    {**GOOD, "components": {"tests": "1"}}, {**GOOD, "flags": "runner_tampered"}, {**GOOD, "tests": {"a": 1}},
    {k: v for k, v in GOOD.items() if k != "notes"},
])
def test_a_malformed_reward_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="reward"):
        reward_from_json(bad)


def test_wire_round_trip_and_bad_calls() -> None:
    assert reward_from_json(json.loads(json.dumps(GOOD))) == Reward(**GOOD)
    calls, errors = calls_from_json({"tool_calls": [{"name": "view", "arguments": {"path": "a"}}],
                                     "errors": [{"kind": "malformed_json", "message": "m"}]})
    assert calls[0].name == "view" and calls[0].arguments == {"path": "a"} and errors[0].kind == "malformed_json"
    for body, fix in [([], "JSON object"), ({"tool_calls": [{"name": 3}]}, "tool_calls[0].name"),
                      ({"tool_calls": [{"name": "v", "arguments": []}]}, "arguments must be a JSON object"),
                      ({"errors": [{"kind": "x", "message": ""}]}, "errors[0].kind")]:
        with pytest.raises(ValueError, match=None) as err:
            calls_from_json(body)
        assert fix in str(err.value)
    with pytest.raises(ValueError, match="role"):
        messages_from_json([{"role": "root", "content": ""}])


def _stub(answers: dict[str, tuple[int, bytes]]):
    """A server that answers each path prefix with a fixed (status, body): a broken or hostile env-server."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = next(v for k, v in answers.items() if k in self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_DELETE = do_GET = _answer  # noqa: N815

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_garbage_answers_are_environment_failures_never_rewards() -> None:
    cfg = EnvConfig(tools="core")
    opened = json.dumps({"session": "s1", "messages": [{"role": "user", "content": "hi"}],
                         "tools": [t["name"] for t in tools_for(cfg)], "system_prompt": cfg.system_prompt}).encode()
    task = generate_tasks(1, seed=3, difficulty="easy")[0]
    for grade_answer, match in [((200, b'{"reward": {"value": "1"}}'), "bad reward"),
                                ((200, b"<html>proxy error</html>"), "not a JSON object"),
                                ((502, b"bad gateway"), "answered 502"),
                                ((200, b'{"reward": ' + json.dumps({**GOOD, "value": 2}).encode()[:-5]), "not a JSON")]:
        httpd = _stub({"/grade": grade_answer, "/sessions/s1": (200, b"{}"), "/sessions": (200, opened)})
        try:
            env = RemoteEnv(cfg, f"http://127.0.0.1:{httpd.server_address[1]}", "token-123456")
            env.reset(task)
            with pytest.raises(RemoteEnvError, match=match):
                env.grade()
            assert env.reward is None
            env.close()
        finally:
            httpd.shutdown()
    wrong_tools = opened.replace(b'"view", ', b"")
    httpd = _stub({"/sessions/s1": (200, b"{}"), "/sessions": (200, wrong_tools)})
    try:
        with pytest.raises(RemoteEnvError, match="set env.tools and env.system_prompt alike"):
            RemoteEnv(cfg, f"http://127.0.0.1:{httpd.server_address[1]}", "token-123456").reset(task)
    finally:
        httpd.shutdown()


def test_the_chooser_skips_a_server_that_just_failed() -> None:
    c = ServerChooser(["http://a:1", "http://b:1", "http://c:1"], cooldown_s=60)
    assert [c.choose() for _ in range(4)] == ["http://a:1", "http://b:1", "http://c:1", "http://a:1"]
    c.failed("http://b:1")
    assert [c.choose() for _ in range(4)] == ["http://c:1", "http://a:1", "http://c:1", "http://a:1"]
    for u in ("http://a:1", "http://c:1"):
        c.failed(u)
    assert c.choose() == "http://b:1"  # all failed: the one that failed longest ago


def test_the_server_closes_sessions_their_client_abandoned(tmp_path) -> None:
    server = EnvServer(EnvConfig(tools="core"), tmp_path, "token-123456", idle_timeout_s=0.4)
    url = server.start()
    try:
        env = RemoteEnv(EnvConfig(tools="core"), url, "token-123456")
        env.reset(generate_tasks(1, seed=4, difficulty="easy")[0])
        (s,) = server.sessions.values()
        sandbox = s.env.sandbox
        deadline = time.monotonic() + 10
        while server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.sessions and server.counters["reaped"] == 1 and sandbox._closed
        with pytest.raises(RemoteEnvError, match="404"):
            env.step([])
    finally:
        server.stop()


def test_the_server_caps_its_sessions(tmp_path) -> None:
    server = EnvServer(EnvConfig(tools="core"), tmp_path, "token-123456", max_sessions=1)
    url = server.start()
    task = generate_tasks(1, seed=4, difficulty="easy")[0]
    try:
        first = RemoteEnv(EnvConfig(tools="core"), url, "token-123456")
        first.reset(task)
        with pytest.raises(RemoteEnvError, match="503.*1 sessions open"):
            RemoteEnv(EnvConfig(tools="core"), url, "token-123456").reset(task)
        first.close()
        second = RemoteEnv(EnvConfig(tools="core"), url, "token-123456")
        second.reset(task)  # a slot is free again
        second.close()
    finally:
        server.stop()
