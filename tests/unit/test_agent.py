"""The agent loop and the rollout worker: token-exact trajectories, malformed calls, self-summarization.

A scripted engine (it replays fixed assistant turns) tests the loop's ordering and bookkeeping; the real
local engine with a tiny random model checks that a policy producing garbage never ends a session early
and that every recorded token is exactly what the engine sampled.
"""

import asyncio

import pytest

from flywheel.config import EnvConfig, ModelConfig, RolloutConfig
from flywheel.envs.env import CodingEnv
from flywheel.rollout.agent import SUMMARY_PREFIX, EnvironmentFailure, run_session
from flywheel.rollout.worker import RolloutWorker
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.types import Generation, Message

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(3, seed=5, split="train", difficulty="easy")


class ScriptedEngine:
    """Replays assistant messages as sampled tokens (log-prob -0.5, the engine's current version)."""

    def __init__(self, chat, turns: list[Message], version: int = 3):
        self.chat, self.turns, self.version, self.prompts = chat, list(turns), version, []

    async def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        msg = self.turns.pop(0) if self.turns else Message("assistant", "nothing more to do")
        ids = self.chat.assistant_tokens(msg)[: sampling.max_new_tokens]
        return Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), finish_reason="stop")


def oracle_turns(task):
    return [Message("assistant", "", tool_calls=[c]) for c in oracle_actions(task)]


def run(coro):
    return asyncio.run(coro)


def test_oracle_session_is_token_exact_and_solves(chat, tasks, tmp_path):
    task = tasks[0]
    engine = ScriptedEngine(chat, oracle_turns(task))
    traj = run(run_session(engine, chat, CodingEnv(ENV, tmp_path), task, RolloutConfig(max_turns=6)))
    assert traj.reward.value == 1.0 and traj.meta["submitted"] is True
    assert traj.num_turns == 3 and traj.num_tool_errors == 0 and len(traj.segments) == 1
    seg = traj.segments[0]
    assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs) == len(seg.versions)
    # Every prompt the engine saw is a prefix of the final context: nothing was ever re-rendered.
    for prompt in engine.prompts:
        assert seg.token_ids[: len(prompt)] == prompt
    sampled = [t for t, m in zip(seg.token_ids, seg.loss_mask) if m]
    expected = [t for m in oracle_turns(task) for t in chat.assistant_tokens(m)]
    assert sampled == expected
    assert {v for v, m in zip(seg.versions, seg.loss_mask) if m} == {3} and traj.min_version == 3


def test_malformed_calls_do_not_end_the_session(chat, tasks, tmp_path):
    bad = [Message("assistant", '<tool_call>{"name": "view", "arguments": {"path": </tool_call>'),
           Message("assistant", '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>')]
    task = tasks[1]
    engine = ScriptedEngine(chat, bad + oracle_turns(task))
    traj = run(run_session(engine, chat, CodingEnv(ENV, tmp_path), task, RolloutConfig(max_turns=8)))
    assert traj.num_turns == 5 and traj.num_tool_errors == 2 and traj.reward.value == 1.0
    text = chat.tokenizer.decode(traj.segments[0].token_ids)
    assert "malformed_json" in text and "teleport" in text


def test_self_summarization_rebuilds_context_in_a_new_segment(chat, tasks, tmp_path):
    task = tasks[2]
    view, edit, submit = oracle_turns(task)
    turns = [view, Message("assistant", "I viewed the file; next I fix the line."),
             edit, Message("assistant", "I fixed the line; next I submit."), submit]
    engine = ScriptedEngine(chat, turns)
    prompt = chat.render(CodingEnv(ENV, tmp_path).reset(task))
    cfg = RolloutConfig(max_turns=8, summarize_at=len(prompt) + 10)  # passed after every turn
    traj = run(run_session(engine, chat, CodingEnv(ENV, tmp_path), task, cfg))
    assert len(traj.segments) == 3 and traj.meta["num_summaries"] == 2 and traj.num_turns == 3
    assert traj.reward.value == 1.0  # one reward shared by every segment
    first, second, third = (chat.tokenizer.decode(s.token_ids) for s in traj.segments)
    assert "Summarize your progress" in first and first.rstrip().endswith("<|im_end|>")
    assert SUMMARY_PREFIX + "I viewed the file" in second and task.problem in second and "# Tools" in second
    assert SUMMARY_PREFIX + "I fixed the line" in third and "I viewed the file" not in third
    # The summary itself is sampled, so trained: it carries loss mask 1 at the end of its segment.
    assert traj.segments[0].loss_mask[-1] == 1


def test_random_policy_on_the_real_engine_runs_to_max_turns(chat, tasks, tmp_path):
    from flywheel.inference.local import LocalEngine
    from flywheel.policy.model import build_model

    model = build_model(ModelConfig(preset="tiny", seed=1), len(chat.tokenizer))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=24, temperature=1.0)

    async def go():
        async with LocalEngine(model, tokenizer=chat.tokenizer) as engine:
            return await run_session(engine, chat, CodingEnv(ENV, tmp_path), tasks[0], cfg, seed=11)

    traj = run(go())
    assert traj.reward is not None and traj.reward.value == 0.0
    seg = traj.segments[0]
    n_sampled = sum(seg.loss_mask)
    assert n_sampled == traj.meta["num_sampled_tokens"] and n_sampled <= 3 * 24
    assert all(lp <= 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if m)
    assert {v for v, m in zip(seg.versions, seg.loss_mask) if m} == {0}


class BrokenEnv:
    def __init__(self):
        self.closed = False

    def reset(self, task):
        raise OSError("sandbox could not be created")

    def close(self):
        self.closed = True


def test_environment_failures_are_retried_then_recorded(chat, tasks):
    with pytest.raises(EnvironmentFailure, match="sandbox could not be created"):
        run(run_session(ScriptedEngine(chat, []), chat, BrokenEnv(), tasks[0], RolloutConfig()))
    made = []

    def factory():
        made.append(BrokenEnv())
        return made[-1]

    worker = RolloutWorker(ScriptedEngine(chat, []), chat, factory, RolloutConfig(max_env_retries=2))
    group = run(worker.run_group(tasks[0], group_size=2))
    assert len(made) == 6 and all(e.closed for e in made)
    assert all(t.env_failure and t.reward is None for t in group)
    assert worker.counters["env_failures"] == 6 and worker.counters["env_failed_sessions"] == 2


class SilentEngine:
    """Never answers: a lost request."""

    version = 0

    async def generate(self, prompt_ids, sampling):
        await asyncio.Event().wait()


def test_an_unanswered_engine_request_is_an_environment_failure(chat, tasks, tmp_path, monkeypatch):
    import flywheel.rollout.agent as agent

    monkeypatch.setattr(agent, "ENGINE_GRACE_S", 0.2)
    env = CodingEnv(ENV, tmp_path)
    try:
        with pytest.raises(EnvironmentFailure, match="engine failed"):
            run(run_session(SilentEngine(), chat, env, tasks[0], RolloutConfig(wall_clock_s=0.5)))
    finally:
        env.close()
