"""CodingEnv end to end on real sandboxes and real pytest: the oracle scores 100 %, doing nothing 0 %."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.env import NO_CALL, SYSTEM_COMPACT, CodingEnv
from flywheel.envs.tools import TOOLS
from flywheel.tasks.loaders import load_tasks
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.types import ToolCall, ToolCallError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def run_policy(env: CodingEnv, task, actions) -> float:
    msgs = env.reset(task)
    assert [m.role for m in msgs] == ["system", "user"] and msgs[1].content == task.problem
    done = False
    for call in actions:
        obs, done = env.step([call])
        assert len(obs) == 1 and obs[0].role == "tool"
        assert not obs[0].content.startswith("Error"), obs[0].content
        if done:
            break
    assert done == bool(actions and actions[-1].name == "submit")
    return env.grade().value


def success_rates(tasks, tmp_path) -> tuple[float, float]:
    oracle = nothing = 0.0
    with CodingEnv(EnvConfig(), tmp_path / "cache") as env:
        for t in tasks:
            oracle += run_policy(env, t, oracle_actions(t))
            nothing += run_policy(env, t, [ToolCall("submit", {})])
    return oracle / len(tasks), nothing / len(tasks)


def test_oracle_scores_all_and_do_nothing_scores_zero(tmp_path):
    tasks = generate_tasks(2, seed=11, difficulty="easy") + generate_tasks(1, seed=11, difficulty="medium") \
        + generate_tasks(1, seed=11, split="heldout", difficulty="hard")
    assert success_rates(tasks, tmp_path) == (1.0, 0.0)


@pytest.mark.slow
def test_oracle_scores_100_percent_on_50_synthetic_tasks(tmp_path):
    tasks = generate_tasks(40, seed=0) + generate_tasks(10, seed=0, split="heldout")
    assert success_rates(tasks, tmp_path) == (1.0, 0.0)


def test_oracle_on_humaneval_and_fixture_tasks(tmp_path):
    tasks = load_tasks(FIX / "humaneval.jsonl").tasks[:1] + load_tasks(FIX / "flywheel.jsonl").tasks[1:]
    with CodingEnv(EnvConfig(), tmp_path / "cache") as env:
        for t in tasks:
            assert run_policy(env, t, oracle_actions(t)) == 1.0, t.id


def test_malformed_calls_do_not_end_the_session(tmp_path):
    task = generate_tasks(1, seed=5, difficulty="easy")[0]
    env = CodingEnv(EnvConfig(), tmp_path / "cache")
    msgs = env.reset(task)
    assert msgs[0].content == SYSTEM_COMPACT and env.tools is TOOLS
    core = ["view", "str_replace", "run_tests", "submit"]
    assert [t["name"] for t in CodingEnv(EnvConfig(tools="core"), tmp_path).tools] == core
    obs, done = env.step([], [ToolCallError("malformed_json", "Expecting ',' delimiter", raw="<tool_call>{")])
    assert not done and obs[0].role == "tool" and obs[0].content.startswith("Error (malformed_json)")
    obs, done = env.step([ToolCall("explode", {}), ToolCall("view", {"pathh": "x"}), ToolCall("view", [1])])
    assert not done and len(obs) == 3 and all(o.content.startswith("Error") for o in obs)
    obs, done = env.step([])
    assert not done and obs[0].role == "user" and obs[0].content == NO_CALL
    calls = oracle_actions(task)
    obs, done = env.step(calls + [ToolCall("view", {"path": "x.py"})])  # calls after submit are not run
    assert done and len(obs) == len(calls) and obs[-1].content == "Submitted."
    r = env.grade()
    assert r.value == 1.0 and r.flags == [] and env.grade() is r
    m = env.metrics()
    assert m["num_tool_calls"] == 4 + len(calls) and m["num_tool_errors"] == 5
    env.close()
    env.close()  # idempotent


def test_cheating_session_is_flagged(tmp_path):
    task = generate_tasks(1, seed=6, difficulty="easy")[0]
    vis = task.visible_tests[0]
    with CodingEnv(EnvConfig(), tmp_path / "cache") as env:
        env.reset(task)
        env.step([ToolCall("write", {"path": vis, "content": "def test_0():\n    pass\n"}),
                  ToolCall("bash", {"command": "cat /etc/hostname"}),
                  ToolCall("submit", {})])
        r = env.grade()
        assert r.components["tests"] == 0.0 and r.flags == ["tests_edited", "outside_read"] and r.value == -2.0
        assert env.metrics()["flag_tests_edited"] == 1.0
        # a new session on the same env starts clean
        env.reset(task)
        assert env.harness.num_calls == 0 and env.reward is None


def test_env_misuse_raises():
    env = CodingEnv(EnvConfig(), "/tmp/unused-cache")
    with pytest.raises(RuntimeError, match="reset"):
        env.step([])
    with pytest.raises(RuntimeError, match="reset"):
        env.grade()
    with pytest.raises(TypeError, match="EnvConfig"):
        CodingEnv({}, "/tmp")


def test_concurrent_sessions_share_one_cached_base(tmp_path):
    """The agent loop runs many envs in threads: the first reset of a task races to build its base."""
    from concurrent.futures import ThreadPoolExecutor

    tasks = generate_tasks(2, seed=12, difficulty="easy") * 2

    def session(t):
        with CodingEnv(EnvConfig(), tmp_path / "cache") as env:
            return run_policy(env, t, oracle_actions(t))

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(session, tasks)) == [1.0] * 4
    assert len(list((tmp_path / "cache").iterdir())) == 2  # one base per task, no temp dirs left behind


def test_rubric_judge_is_mixed_into_grade_from_a_worker_thread(tmp_path):
    """As in the agent loop: the env runs in a thread (`asyncio.to_thread`), the judge's engine on the loop."""
    import asyncio

    from test_reward import CharTokenizer, ScriptedEngine, TextChat

    from flywheel.envs.judge import RubricJudge

    task = generate_tasks(1, seed=13, difficulty="easy")[0]
    cfg = EnvConfig(rubric_weight=0.5)
    with pytest.raises(ValueError, match="needs a RubricJudge"):
        CodingEnv(cfg, tmp_path / "cache")
    engine = ScriptedEngine("minimal: 6", CharTokenizer())

    async def main():
        judge = RubricJudge(engine, TextChat(), [("minimal", 1.0, "a one-line fix")])
        env = CodingEnv(cfg, tmp_path / "cache", judge=judge, loop=asyncio.get_running_loop())
        await asyncio.to_thread(run_policy, env, task, oracle_actions(task))
        r = await asyncio.to_thread(env.grade)
        env.close()
        return r

    r = asyncio.run(main())
    assert r.components["tests"] == 1.0 and r.components["rubric"] == pytest.approx(0.6)
    assert r.value == pytest.approx(1.0 + 0.5 * 0.6)
    assert "+" + task.meta["new"][0] in CharTokenizer().decode(engine.prompts[0])  # the judge saw the diff


@pytest.mark.parametrize("require_submit,test_unsubmitted", [(False, False), (True, False), (True, True)])
def test_a_fix_left_unsubmitted_scores_only_when_submit_is_not_required(tmp_path, require_submit, test_unsubmitted):
    """`env.require_submit`: the same correct fix, once submitted and once left on disk at the turn limit; the
    unsubmitted session's hidden tests run only with `env.test_unsubmitted` (for the logs)."""
    from flywheel.rollout.evaluate import solved
    from flywheel.types import Trajectory

    task = generate_tasks(1, seed=3, difficulty="easy")[0]
    fix = [c for c in oracle_actions(task) if c.name != "submit"]
    cfg = EnvConfig(require_submit=require_submit, test_unsubmitted=test_unsubmitted, grade_cache=0)
    with CodingEnv(cfg, tmp_path / "cache") as env:
        assert run_policy(env, task, [*fix, ToolCall("submit", {})]) == 1.0
        left = run_policy(env, task, fix)
        reward = env.grade()
    assert left == (0.0 if require_submit else 1.0)
    tested = not require_submit or test_unsubmitted
    assert reward.components["tests"] == (1.0 if tested else 0.0)
    assert reward.components.get("tests_not_run") == (None if tested else 1.0)
    assert bool(reward.tests) == tested and set(reward.tests.values()) <= {"passed"}
    assert reward.components.get("not_submitted") == (1.0 if require_submit else None)
    assert solved(Trajectory(task_id=task.id, group_id="g", segments=[], reward=reward)) == (not require_submit)
