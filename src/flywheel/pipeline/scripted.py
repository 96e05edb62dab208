"""Agent sessions with a scripted policy, run through the real harness, sandbox and grader.

    trajs = scripted_group(chat, task, env_cfg, cache_dir, version=3, seed=0)   # one group, several behaviours

Why: the dashboard's tests and benchmark need transcripts that read like a policy's (tool calls, tool outputs,
a self-summary, hidden-test verdicts, an anti-cheat flag) in a run directory written by flywheel's own writers.
A tiny random policy almost never calls a tool, and a mid-trained one takes minutes to build; replaying fixed
assistant turns through `rollout.agent.run_session` gives real tool outputs and real grades in seconds. Only
the policy is scripted: each sampled token gets a log-prob drawn from a seeded generator and the version given.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from flywheel.config import EnvConfig, RolloutConfig
from flywheel.envs.env import CodingEnv
from flywheel.policy.chat import ChatFormat
from flywheel.rollout.agent import run_session
from flywheel.tasks.synth import oracle_actions
from flywheel.types import Generation, Message, Task, ToolCall, Trajectory

SUMMARY = Message("assistant", "I viewed the module and fixed the wrong expression; what is left is to submit.")


class ScriptedEngine:
    """An Engine that replays assistant messages as sampled tokens."""

    def __init__(self, chat: ChatFormat, turns: list[Message], version: int, seed: int):
        self.chat, self.turns, self.version = chat, list(turns), version
        self.rng = random.Random(seed)

    async def generate(self, prompt_ids, sampling) -> Generation:
        msg = self.turns.pop(0) if self.turns else Message("assistant", "I am done.")
        ids = self.chat.assistant_tokens(msg)[: sampling.max_new_tokens]
        logprobs = [-min(12.0, self.rng.expovariate(2.5)) for _ in ids]
        return Generation(ids, logprobs, [self.version] * len(ids), finish_reason="stop")


def _calls(task: Task) -> list[ToolCall]:
    return oracle_actions(task)


def behaviours(task: Task) -> dict[str, list[Message]]:
    """Scripts of assistant turns: a clean fix, a fix after a self-summary, a wrong edit, a broken call,
    and an edit of the tests (the grader flags it)."""
    calls = _calls(task)
    fix = [Message("assistant", "Let me look at the code first.", tool_calls=[c]) if c.name == "view" else
           Message("assistant", "", tool_calls=[c]) for c in calls]
    test_run = Message("assistant", "Running the visible tests.", tool_calls=[ToolCall("run_tests", {})])
    path = next((c.arguments["path"] for c in calls if "path" in c.arguments), "")
    # whole-file replacements with str_replace, so the scripts work with the core tool set (no `write`)
    wrong = Message("assistant", "", tool_calls=[ToolCall(
        "str_replace", {"path": path, "old": task.files.get(path, ""), "new": "def broken():\n    pass\n"})])
    tests = sorted(p for p in task.files if Path(p).name.startswith("test_"))
    cheat = [Message("assistant", "These tests look wrong; simplifying them.", tool_calls=[ToolCall(
        "str_replace", {"path": tests[0], "old": task.files[tests[0]], "new": "def test_ok():\n    assert True\n"})])
             ] if tests else []
    submit = Message("assistant", "", tool_calls=[ToolCall("submit", {})])
    return {
        "fix": [test_run, *fix],
        "fix_after_summary": [*fix[:-1], SUMMARY, fix[-1]],
        "wrong_edit": [fix[0], wrong, test_run, submit],
        "malformed": [Message("assistant", '<tool_call>{"name": "view", "arguments": {"path": </tool_call>'),
                      fix[0], submit],
        "edits_tests": [*cheat, submit],
    }


def scripted_group(chat: ChatFormat, task: Task, env_cfg: EnvConfig, cache_dir: Path, *, version: int,
                   seed: int, group_id: str = "") -> list[Trajectory]:
    """One group of sessions of `task`, one per behaviour, graded by the real grader."""
    group_id = group_id or f"scripted/v{version}/{task.id}"

    # One self-summary, after the fix and before the submit: a probe session of the first two turns measures the
    # context they fill, and the threshold is one token short of it.
    script = behaviours(task)["fix_after_summary"]
    probe = asyncio.run(run_session(ScriptedEngine(chat, script[:2], version, seed), chat, CodingEnv(env_cfg, cache_dir),
                                    task, RolloutConfig(max_turns=2, max_new_tokens=4096)))
    threshold = len(probe.segments[0].token_ids) - 1

    async def one(i: int, name: str, script: list[Message]) -> Trajectory:
        summarize_at = threshold if name == "fix_after_summary" else 0
        cfg = RolloutConfig(max_turns=8, max_new_tokens=4096, max_total_tokens=16384, summarize_at=summarize_at)
        engine = ScriptedEngine(chat, script, version, seed * 100 + i)
        traj = await run_session(engine, chat, CodingEnv(env_cfg, cache_dir), task, cfg, group_id=group_id,
                                 seed=seed * 100 + i)
        traj.meta["script"] = name
        return traj

    async def all_of_them() -> list[Trajectory]:
        return list(await asyncio.gather(*[one(i, n, s) for i, (n, s) in enumerate(behaviours(task).items())]))

    return asyncio.run(all_of_them())
