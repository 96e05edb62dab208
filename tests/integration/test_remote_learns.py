"""The demo's learning run with every RL session on a `flywheel env-server` child process: held-out pass@1 rises.

The run is test_demo_learns.py's (the shared `demo_base`, 14 RL steps, the same assertions in demo_learning.py)
with `env.remote_url` set: the node process's rollout worker gets `RemoteEnv`s, so every training session is
reset, stepped and graded on the server (configs/demo.toml's env section, the same sandbox and reward as a local
run), and the server's /v1/info counters account for every rollout the trainer received. The held-out evaluation
before and after is the instrument that measures learning and runs locally, as in test_demo_learns.py.

    FLYWHEEL_DEMO_BASE=/path/to/base pytest -q tests/integration/test_remote_learns.py   # reuse a built base
"""

import pytest
from build_demo_base import DEMO_CONFIG
from demo_learning import STEPS, assert_learned
from envserver_child import TOKEN, env_server, server_info

from flywheel.pipeline.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]


def test_demo_learns_with_every_session_on_an_env_server(demo_base, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_ENV_TOKEN", TOKEN)  # the node process inherits it
    run_dir = tmp_path / "demo"
    demo_base.seed_summary(run_dir)
    with env_server(tmp_path / "srv", str(DEMO_CONFIG)) as url:
        cfg = demo_base.config(run_dir, "--trainer.num_steps", str(STEPS), f"--env.remote_url={url}")
        summary = run_job(cfg, show_progress=False)
        info = server_info(url)
    print(f"pass@1 {summary['pass1_before']:.3f} -> {summary['pass1_after']:.3f}; server {info}")
    assert_learned(summary, run_dir)
    rl = summary["rl"]
    assert info["grades"] >= rl["rollouts"] > 0 and info["sessions"] >= info["grades"], (info, rl)
    assert info["steps"] > 0
    assert info["env_errors"] == 0 and rl.get("buffer/env_failures", 0) == 0
