"""The env-server (`flywheel env-server`, envs/remote_server.py) and its client (envs/remote_client.py), as real
server processes on loopback: a remote session gives what a local one gives, bad requests get a 4xx that says
why, and a dead or stalled server is an environment failure — retried on another server, never a reward."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.config import EnvConfig, RolloutConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.remote_client import RemoteEnv, RemoteEnvError, env_factory
from flywheel.rollout.worker import RolloutWorker
from flywheel.sandbox import services
from flywheel.tasks.loaders import save_tasks, task_to_dict
from flywheel.tasks.migration import migration_task, reference_actions
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.types import Generation, Message

TOKEN = "test-token-0123456789"
CFG = EnvConfig(tools="core", command_timeout_s=5.0, remote_timeout_s=2.0)


class Server:
    """`flywheel env-server` in a child process on a free port."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        env = dict(os.environ, FLYWHEEL_ENV_TOKEN=TOKEN)
        self.proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "env-server", "--port", "0",
                                      "--cache-dir", str(tmp), "--env.tools=core", "--idle-timeout-s", "30", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert "listening on" in line, line + (self.proc.stdout.read() if self.proc.poll() is not None else "")
        self.url = line.split("listening on ", 1)[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request(method, "/v1" + path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, (json.loads(data) if data.startswith(b"{") else data.decode(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "srv")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def task():
    return generate_tasks(1, seed=11, split="train", difficulty="easy")[0]


def test_a_remote_session_gives_what_a_local_one_gives(server, task, tmp_path) -> None:
    with RemoteEnv(CFG, server.url, TOKEN) as remote, CodingEnv(CFG, tmp_path / "local") as local:
        assert remote.reset(task) == local.reset(task)
        for call in oracle_actions(task):
            assert remote.step([call]) == local.step([call])
        r, ref = remote.grade(), local.grade()
        assert (r.value, r.tests, r.flags) == (ref.value, ref.tests, ref.flags) and r.value == 1.0
        assert remote.metrics()["num_tool_calls"] == local.metrics()["num_tool_calls"] == 3
    status, info = server.request("GET", "/info")
    assert status == 200 and info["num_sessions"] == 0 and info["sessions"] == 1  # closed on the server too


def test_bad_requests_get_a_clear_4xx(server, task) -> None:
    assert server.request("GET", "/health", token=None) == (200, {"ok": True})
    status, body = server.request("GET", "/info", token="wrong-token-xxxx")
    assert status == 401 and "token" in body["error"]
    assert server.request("GET", "/info", token=None)[0] == 401
    status, body = server.request("POST", "/sessions", b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = server.request("POST", "/sessions", b'{"task_id": "x"}')
    assert status == 400 and "'task'" in body["error"]
    broken = dict(task_to_dict(task), fail_to_pass=[], pass_to_pass=[])
    status, body = server.request("POST", "/sessions", json.dumps({"task": broken}).encode())
    assert status == 400 and "no hidden tests" in body["error"]
    status, body = server.request("POST", "/sessions/nope/step", b"{}")
    assert status == 404 and "no session" in body["error"]
    status, body = server.request("POST", "/sessions", json.dumps({"task": task_to_dict(task)}).encode())
    assert status == 200
    sid = body["session"]
    status, body = server.request("POST", f"/sessions/{sid}/step", b'{"tool_calls": {"name": "view"}}')
    assert status == 400 and "JSON arrays" in body["error"]
    status, body = server.request("POST", f"/sessions/{sid}/step", b'{"errors": [{"kind": "oops", "message": ""}]}')
    assert status == 400 and "errors[0].kind" in body["error"]
    status, _ = server.request("POST", f"/sessions/{sid}/step", b"x" * (33 * 1024 * 1024))
    assert status == 413
    # a well-formed call the harness cannot use is an observation, as in-process
    status, body = server.request("POST", f"/sessions/{sid}/step", b'{"tool_calls": [{"name": "fly", "arguments": {}}]}')
    assert status == 200 and body["messages"][0]["content"].startswith("Error")
    assert server.request("DELETE", f"/sessions/{sid}")[0] == 200
    assert server.request("DELETE", f"/sessions/{sid}")[0] == 404


def test_a_killed_or_stalled_server_is_an_environment_failure(tmp_path, task) -> None:
    a, b = Server(tmp_path / "a"), Server(tmp_path / "b")
    try:
        env = RemoteEnv(CFG, a.url, TOKEN)
        env.reset(task)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)
        with pytest.raises(RemoteEnvError, match="failed"):
            env.step(oracle_actions(task)[:1])
        env.close()  # never raises, whatever the server's state
        quick = CFG.model_copy(update={"grade_timeout_s": 1.0, "remote_timeout_s": 1.0})
        env = RemoteEnv(quick, b.url, TOKEN)
        env.reset(task)
        os.kill(b.proc.pid, signal.SIGSTOP)  # alive, accepting connections, answering nothing
        t0 = time.monotonic()
        with pytest.raises(RemoteEnvError, match="did not answer within 2s"):
            env.grade()
        assert time.monotonic() - t0 < 5
        assert env.reward is None
    finally:
        a.stop()
        b.stop()


class ScriptedEngine:
    """Plays a fixed list of assistant turns; the turn is the number of assistant turns already in the prompt, so
    sessions of one group can interleave on it."""

    def __init__(self, chat, turns: list[Message]):
        self.chat, self.turns = chat, turns

    async def generate(self, prompt_ids, sampling):
        k = self.chat.tokenizer.decode(prompt_ids, skip_special_tokens=False).count("<|im_start|>assistant") - 1
        msg = self.turns[k] if k < len(self.turns) else Message("assistant", "done")
        ids = self.chat.assistant_tokens(msg)[: sampling.max_new_tokens]
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), finish_reason="stop")


def test_the_worker_retries_a_dead_servers_sessions_elsewhere_and_never_rewards_them(chat, tmp_path, task,
                                                                                     monkeypatch) -> None:
    monkeypatch.setenv("FLYWHEEL_ENV_TOKEN", TOKEN)
    live, dead = Server(tmp_path / "live"), Server(tmp_path / "dead")
    dead.stop()
    try:
        turns = [Message("assistant", "", tool_calls=[c]) for c in oracle_actions(task)]
        rollout = RolloutConfig(max_turns=6, concurrency=4, max_env_retries=2)
        cfg = CFG.model_copy(update={"remote_url": [dead.url, live.url]})
        worker = RolloutWorker(ScriptedEngine(chat, turns), chat, env_factory(cfg, tmp_path / "c"), rollout)
        group = asyncio.run(worker.run_group(task, group_size=4, group_id="g"))
        assert [t.reward.value if t.reward else t.env_failure for t in group] == [1.0] * 4
        assert worker.counters["env_failures"] >= 1 and all(t.env_failure is None for t in group)
        cfg = CFG.model_copy(update={"remote_url": [dead.url]})
        worker = RolloutWorker(ScriptedEngine(chat, turns), chat, env_factory(cfg, tmp_path / "c"), rollout)
        group = asyncio.run(worker.run_group(task, group_size=2, group_id="g"))
        assert all(t.reward is None and "env-server" in (t.env_failure or "") for t in group)
        assert worker.counters["env_failures"] == 2 * 3  # every try of both sessions
    finally:
        live.stop()


@pytest.mark.skipif(not services.available() or services.postgres_bin() is None,
                    reason="needs root, network namespaces, bubblewrap and PostgreSQL")
def test_the_migration_task_through_a_server_with_its_own_task_file(tmp_path) -> None:
    task = migration_task()
    save_tasks([task], tmp_path / "tasks.jsonl")
    s = Server(tmp_path / "srv", "--tasks", str(tmp_path / "tasks.jsonl"), "--env.tools=all")
    try:
        cfg = EnvConfig(remote_timeout_s=10.0)
        with RemoteEnv(cfg, s.url, TOKEN) as env:
            env.reset(task)
            for c in reference_actions(task):
                env.step([c])
            assert env.grade().value == 1.0
        status, body = s.request("POST", "/sessions", b'{"task_id": "no-such-task"}')
        assert status == 404 and "unknown task_id" in body["error"]
    finally:
        s.stop()
