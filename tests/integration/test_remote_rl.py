"""The RL loop with its sessions on an env-server (`env.remote_url`): a node process whose rollout worker drives
`RemoteEnv`s against a `flywheel env-server` child process, the trainer, the weight store. Every trained session
ran and was graded on the server (its counters say so), none is an environment failure.

What it does not show: that such a run *learns* — the tiny random policy here solves nothing in two steps;
tests/integration/test_remote_learns.py runs the demo's learning run so (`make test-long`).
"""

import json

import pytest
from envserver_child import TOKEN, env_server, server_info

from flywheel.config import load_config
from flywheel.orchestrator.loop import run_rl
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.tasks.synth import generate_tasks

pytestmark = pytest.mark.slow


@pytest.fixture(name="env_server")
def env_server_fixture(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_ENV_TOKEN", TOKEN)  # the node process inherits it
    with env_server(tmp_path / "srv", "--env.tools=core") as url:
        yield url


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
    info = server_info(env_server)
    assert info["grades"] >= 2 * 4 and info["sessions"] >= info["grades"]  # two batches of 4 sessions, graded there
    assert info["env_errors"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert out.get("buffer/env_failures", 0) == 0 and out["buffer/admitted"] >= 4  # groups of 2, 4 per batch
