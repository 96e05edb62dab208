"""The pool's rollouts train the served policy (online.pool.train): a real `flywheel serve` process on loopback,
simulated users through the official `openai` client (requests and feedback), background rollouts on the serving
engine. The learner takes group steps on the pool's graded groups beside its feedback steps, proposes a candidate
that says so, and the gate judges it on held-out coding tasks through the agent loop and sandboxed grading (paired
with the serving version), its figures in the gate's event.

The tiny random policy solves nothing, so every group it grades is uniform (reward 0 for all): uniform groups are
kept here (`drop_uniform_groups = false`, their advantages are 0) so that group steps run at all; whether the
policy learns from the pool is `test_pool_training_raises_coding_pass1_from_the_demo_base` (marked long)."""

import asyncio
import json
import time

import pytest
from polling import wait_for

from flywheel.config import load_config
from flywheel.online.deploy import deployed_version
from flywheel.online.events import EventLog
from flywheel.online.keys import new_key
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.online.simulator import SimUser, SuggestionTask, simulate
from flywheel.pipeline.evaluation import evaluate_model
from flywheel.policy.model import load_model, save_model
from flywheel.policy.tokenizer import load_tokenizer, save_tokenizer
from flywheel.rollout.evaluate import paired_difference
from flywheel.tasks.loaders import load_tasks
from flywheel.weights.sync import Subscriber

POOLTRAIN = ["--online.pool.rollouts=true", "--online.pool.train=true", "--online.pool.num_tasks=4",
             "--online.pool.groups_in_flight=2", "--online.pool.max_background_rows=4", "--rollout.group_size=2",
             "--rollout.max_new_tokens=24", "--rollout.max_turns=2", "--rollout.temperature=1.0",
             "--online.pool.batch_size=2", "--online.pool.candidate_every_steps=2",
             "--online.pool.drop_uniform_groups=false", "--online.pool.max_staleness=1",
             "--online.learner.batch_size=4", "--online.learner.candidate_every_events=1000",
             "--online.gate.num_prompts=8", "--online.gate.coding_num_tasks=3", "--online.gate.coding_num_samples=1",
             "--eval.temperature=1.0"]




@pytest.mark.slow
def test_the_learner_takes_group_steps_and_the_gate_judges_the_candidate_on_held_out_coding_tasks(tmp_path):
    policy = build_policy(tmp_path / "model")
    srv = ServerProcess(tmp_path / "run", policy, POOLTRAIN)
    try:
        elog = EventLog(srv.run_dir / "online.db")
        admin = srv.key_file.read_text().strip()
        users = []
        for i in range(2):
            key, rec = new_key(f"user{i}", 100_000, 1 << 16)
            elog.add_key(rec)
            users.append(SimUser(f"user{i}", key, SuggestionTask()))
        its = asyncio.run(simulate(srv.base_url, users, 16, "flywheel", concurrency=4, seed=3))
        assert all(i.ok and i.feedback_ok for i in its)  # users are served while the pool rolls out and trains

        def judged():
            cands = {e.version: e for e in elog.events(("candidate",)) if e.data.get("pool")}
            gates = [e for e in elog.events(("gate_pass", "gate_reject")) if e.version in cands]
            return gates and (cands[gates[0].version], gates[0])

        cand, gate = wait_for(judged, 50, "a candidate with group steps, judged by the gate")
        pool = cand.data["pool"]
        assert pool["num_steps"] >= 2 and pool["num_trajectories"] >= 4 and pool["num_groups"] >= 2
        assert pool["staleness_max"] <= 1 and pool["mean_reward"] is not None
        assert "pool groups" in cand.reason
        coding = gate.data["coding"]  # held-out coding tasks, both versions, paired per task
        assert coding["num_tasks"] == 3 and coding["num_samples"] == 1
        assert 1 <= coding["num_paired"] <= 3, coding
        assert 0.0 <= coding["serving"]["score"] <= 1.0 and 0.0 <= coding["candidate"]["score"] <= 1.0
        assert {"wins", "losses", "p_worse", "mean_delta"} <= set(coding)
        assert gate.data["serving_version"] == cand.data["base_version"] == 0
        deployed = {e.version for e in elog.events(("deploy",))}
        if gate.kind == "gate_pass":
            assert "held-out coding tasks: no significant regression" in gate.reason and gate.version in deployed
        else:
            assert gate.version not in deployed

        status = srv.status(admin)
        learner = status["learner"]
        assert learner["num_group_steps"] >= 2 and learner["num_steps"] >= learner["num_group_steps"]
        groups = learner["groups"]
        assert groups["received"] >= 2 and groups["admitted"] >= 4 and groups["dropped_overflow"] == 0
        assert status["pool"]["groups"] >= groups["received"] - 2  # the learner saw the pool's groups
        assert learner["num_trained"] >= 4  # and users' feedback trained the same learner
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_path.read_text()[-3000:]



GROUP_STEPS, CANDIDATE_EVERY = 8, 4  # two candidates, each 4 group steps on from what is deployed
MARGIN = 0.04
# The demo's RL settings (configs/demo.toml) as serve overrides; the demo's RL takes pass@1 0.225 -> 0.430 in 16
# steps of 32 sessions at lr 1e-4 (docs/benchmarks.md). `seed = 7` gives the gate held-out tasks of its own
# (generated with seed 8), so the final evaluation on the demo's 100 held-out tasks (seed 1) is not the set the
# gate selected candidates on.
DEMO_POOL = ["--seed=7", "--env.tools=core", "--env.require_submit=true", "--rollout.group_size=8",
             "--rollout.max_turns=4", "--rollout.max_new_tokens=96", "--rollout.temperature=1.0",
             "--rollout.concurrency=32", "--trainer.update_epochs=2", "--online.learner.lr=1e-4",
             "--online.pool.rollouts=true", "--online.pool.train=true", "--online.pool.num_tasks=400",
             "--online.pool.groups_in_flight=4", "--online.pool.max_background_rows=32", "--online.pool.batch_size=32",
             f"--online.pool.candidate_every_steps={CANDIDATE_EVERY}", "--online.pool.max_staleness=1",
             "--online.gate.num_prompts=8", "--online.gate.coding_num_tasks=32", "--online.gate.coding_num_samples=2",
             "--eval.temperature=1.0"]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(2400)
def test_pool_training_raises_coding_pass1_from_the_demo_base(demo_base, tmp_path):
    """No users: the pool alone trains the served policy (the schedule is work-conserving). After GROUP_STEPS
    group steps (two candidates judged: with no users each holds exactly CANDIDATE_EVERY group steps) the deployed
    version is evaluated like the demo's base was (the 100 held-out tasks, 4 sessions each at temperature 1.0) and
    compared with the base's own results, paired per task."""
    srv = ServerProcess(tmp_path / "run", demo_base.model_dir, DEMO_POOL)
    t0 = time.monotonic()
    try:
        elog = EventLog(srv.run_dir / "online.db")
        admin = srv.key_file.read_text().strip()

        def done():
            judged = elog.events(("gate_pass", "gate_reject"))
            shipped = {e.version for e in elog.events(("deploy",))}
            return (len(judged) >= GROUP_STEPS // CANDIDATE_EVERY  # a passed candidate's deploy follows its gate_pass
                    and all(e.version in shipped for e in judged if e.kind == "gate_pass")
                    and srv.status(admin)["learner"])

        learner = wait_for(done, 1800, f"{GROUP_STEPS} group steps, every candidate judged")
        train_s = time.monotonic() - t0
        version = deployed_version(elog.events(("deploy", "rollback")))
        gates = [{"version": e.version, "kind": e.kind, **{k: e.data["coding"][k]["score"]
                                                           for k in ("serving", "candidate")}}
                 for e in elog.events(("gate_pass", "gate_reject"))]
    finally:
        srv.stop()
    assert version is not None and version > 0, (learner, gates)  # a candidate trained on the pool shipped
    sub = Subscriber(str(srv.run_dir / "weights"))
    assert sub.poll(version) is not None, sub.last_error
    model = load_model(demo_base.model_dir)
    model.load_state_dict({k: t.clone() for k, t in sub.tensors.items()}, strict=False)
    out = tmp_path / "deployed"
    save_model(model, out)
    tok = load_tokenizer(demo_base.model_dir)
    save_tokenizer(tok, out)
    cfg = load_config(None, [f"--run_dir={tmp_path / 'eval'}", *DEMO_POOL, "--eval.num_samples=4"])
    tasks = load_tasks(demo_base.model_dir.parent / "tasks" / "heldout.jsonl").tasks[:100]
    t1 = time.monotonic()
    res = evaluate_model(cfg, out, tok, tasks, tmp_path / "eval-cache")
    before_rows = [json.loads(x) for x in (demo_base.model_dir.parent / "eval_before.jsonl").read_text().splitlines()]
    gain, se, n = paired_difference(res.per_task, before_rows)
    figures = {"pass1_before": demo_base.pass1, "pass1_after": res.pass_at[1], "gain": gain, "gain_se": se,
               "num_tasks": n, "deployed_version": version, "group_steps": learner["num_group_steps"],
               "groups": learner["groups"], "gates": gates, "train_s": round(train_s), "eval_s":
               round(time.monotonic() - t1)}
    print("pool training figures:", json.dumps(figures))
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1))
    assert res.pass_at[1] >= demo_base.pass1 + MARGIN, figures
