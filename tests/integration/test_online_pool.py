"""One pool (online/pool.py): `flywheel serve` with `online.pool.rollouts = true` runs simulated RL rollouts on its
serving engine at background priority. A real server process on loopback and the official `openai` client: the
rollouts make progress while no user is there, users' requests all complete while rollouts run, background rows
stay within their cap, and every graded group is logged token-exact."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from polling import wait_for

from flywheel.config import load_config
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.online.service import Service
from flywheel.types import Trajectory

CAP = 2
POOL = ["--online.learner.enabled=false", "--online.pool.rollouts=true", "--online.pool.num_tasks=4",
        "--online.pool.groups_in_flight=2", f"--online.pool.max_background_rows={CAP}", "--rollout.group_size=2",
        "--rollout.max_new_tokens=24", "--rollout.max_turns=2", "--rollout.temperature=1.0"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    policy = build_policy(tmp_path_factory.mktemp("pool-policy") / "model")
    srv = ServerProcess(tmp_path_factory.mktemp("pool-serve") / "run", policy, POOL)
    yield srv
    srv.stop()  # SIGTERM with rollouts in flight: the pool cancels its sessions and the server exits cleanly
    assert srv.proc.returncode == 0, srv.log_path.read_text()[-3000:]


def _pool(srv, key):
    return srv.status(key)["pool"]




def test_users_are_served_while_background_rollouts_run_and_rollouts_progress_when_idle(server):
    key = server.key_file.read_text().strip()
    # idle: no user at all, rollouts are generated and graded on the serving engine
    idle = wait_for(lambda: (p := _pool(server, key))["trajectories"] >= 2 and p, 60, "rollouts with no user")
    assert idle["failed_groups"] == 0 and idle["mean_reward"] is not None  # graded, not only generated

    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "Continue this line:\nvalue = "}]

    def user(i):
        t0 = time.perf_counter()
        r = client.chat.completions.create(model="flywheel", messages=msgs, max_tokens=8, seed=i)
        return r, time.perf_counter() - t0

    before = _pool(server, key)
    with ThreadPoolExecutor(4) as ex:
        replies = list(ex.map(user, range(12)))
    after = _pool(server, key)
    assert all(r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
               for r, _ in replies)
    assert after["sampled_tokens"] > before["sampled_tokens"] or after["sessions_running"] > 0  # rollouts ran too
    assert 1 <= after["peak_background_rows"] <= CAP == after["max_background_rows"]

    # the trajectory log: graded groups, token-exact, every sampled token stamped with the serving version
    lines = (server.run_dir / "pool" / "trajectories.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["index"] for r in rows] == list(range(len(rows))) and len(rows) >= 1
    trajs = [Trajectory.from_dict(t) for r in rows for t in r["group"]]
    graded = [t for t in trajs if t.reward is not None]
    assert graded and all(t.group_id.startswith("pool/") for t in graded)
    for t in graded:
        for s in t.segments:
            assert len(s.token_ids) == len(s.loss_mask) == len(s.logprobs) == len(s.versions)
            assert {v for v, m in zip(s.versions, s.loss_mask) if m} <= {0} and sum(s.loss_mask) >= 1


def test_a_background_cap_larger_than_the_batch_is_refused_naming_both_settings(tmp_path):
    cfg = load_config(None, [f"--run_dir={tmp_path}", "--online.pool.rollouts=true", "--inference.max_batch_size=4",
                             "--online.pool.max_background_rows=8"])
    with pytest.raises(ValueError, match=r"online.pool.max_background_rows = 8 exceeds inference.max_batch_size = 4"):
        Service.build(cfg)
