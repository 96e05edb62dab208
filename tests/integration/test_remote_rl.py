"""The RL loop with its sessions on an env-server (`env.remote_url`): a node process whose rollout worker drives
`RemoteEnv`s against a `flywheel env-server` child process, the trainer, the weight store. Every trained session
ran and was graded on the server (its counters say so), none is an environment failure.

What it does not show: that such a run *learns* — the tiny random policy here solves nothing in two steps; the
learning runs are the demo's (tests/integration/test_demo_learns.py), and the remote session is shown
observation-for-observation equal to a local one (tests/unit/test_env_server.py), so the learning carries over.
"""

import http.client
import json
import os
import signal
import subprocess
import sys

import pytest

from flywheel.config import load_config
from flywheel.orchestrator.loop import run_rl
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.tasks.synth import generate_tasks

pytestmark = pytest.mark.slow
TOKEN = "remote-rl-token-0123456789"


@pytest.fixture
def env_server(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_ENV_TOKEN", TOKEN)  # the node process inherits it
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "env-server", "--port", "0", "--cache-dir",
                             str(tmp_path / "srv"), "--env.tools=core"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield line.split("listening on ", 1)[1].strip()
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(10)


def test_rl_steps_with_every_session_on_the_env_server(env_server, tmp_path):
    tok = train_tokenizer(default_corpus(200_000), 512)
    save_tokenizer(tok, tmp_path / "tokenizer")
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        "--run_dir", str(run_dir), "--orchestrator.mode", "async", "--orchestrator.drop_uniform_groups", "false",
        "--env.tools", "core", f"--env.remote_url={env_server}", "--rollout.group_size", "2", "--rollout.max_turns",
        "2", "--rollout.max_new_tokens", "16", "--rollout.concurrency", "4", "--trainer.batch_size", "4",
        "--trainer.num_steps", "2", "--trainer.lr", "1e-3"])
    save_model(build_model(cfg.model, len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
               tmp_path / "model")
    tasks = generate_tasks(4, seed=3, split="train", difficulty="easy")
    out = run_rl(cfg, run_dir, tmp_path / "model", tmp_path / "tokenizer", tasks)
    assert out["steps"] == 2 and not out["interrupted"]
    port = int(env_server.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/info", headers={"Authorization": f"Bearer {TOKEN}"})
    info = json.loads(conn.getresponse().read())
    assert info["grades"] >= 2 * 4 and info["sessions"] >= info["grades"]  # two batches of 4 sessions, graded there
    assert info["env_errors"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert out.get("buffer/env_failures", 0) == 0 and out["buffer/admitted"] >= 4  # groups of 2, 4 per batch
