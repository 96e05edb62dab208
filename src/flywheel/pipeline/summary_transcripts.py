"""Mid-training transcripts that summarize: scripted sessions of long tasks, run by the real agent loop with
self-summarization on, so the base policy has seen a summary turn before RL asks it for one.

    examples = summary_transcripts(long_tasks, n, chat, env_factory, cfg.rollout, cfg.model.max_seq_len)

Why: the agent loop asks for a summary past `rollout.summarize_at` tokens, and the summary is sampled like any turn.
A policy mid-trained only on one-window sessions has never seen that request answered; asked, the demo's base
answered with a tool call every time (`flywheel bench summarize`: 100 % `tool_calls+empty`), so every rebuilt
context held the empty-summary note and no summary carried anything. Here the known fix of a long task
(tasks/synth/long.py: one bug per file) is played one call per turn through `rollout.agent.run_session`, with the
real tools, sandbox and grader, and each summary request is answered with what the session did so far: the files
it viewed, each edit as `old` -> `new` in its file, whether the tests ran, and which of the task's files are not
fixed yet (only what the statement and the session's own observations show, never the plan of a later turn).
Each segment becomes one example (loss on the assistant's turns, the summary among them), so the model sees the
request, the summary, and the rebuilt context going on from it.

Config: `[midtrain] summary_transcripts` (how many; 0 = none), `summary_kind`, `summary_num_files`,
`summary_pad` (the long tasks' shape); the window and threshold are `model.max_seq_len` and `rollout.summarize_at`.
Tests: tests/unit/test_summary_transcripts.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flywheel.config import RolloutConfig
from flywheel.envs.env import CodingEnv
from flywheel.rollout.agent import SUMMARY_REQUEST, run_session
from flywheel.tasks.synth import oracle_actions
from flywheel.types import Generation, Message, Task, ToolCall


def oracle_summary(task: Task, done: list[ToolCall]) -> str:
    """What a continuation needs after `done`: the edits made (file, old and new text), the files viewed, and the
    task's files (its `meta["summary_facts"]`) not edited yet."""
    edits = [c.arguments for c in done if c.name == "str_replace"]
    edited = {e["path"] for e in edits}
    parts = [f"Fixed {e['path']}: `{e['old']}` -> `{e['new']}`." for e in edits]
    viewed = [p for p in dict.fromkeys(c.arguments.get("path") for c in done if c.name == "view") if p not in edited]
    if viewed:
        parts.append("Viewed " + ", ".join(str(p) for p in viewed) + ".")
    if any(c.name == "run_tests" for c in done):
        parts.append("Ran the tests.")
    left = [f for f in task.meta.get("summary_facts", []) if f not in edited]
    parts.append(("Still to fix: " + ", ".join(left) + ".") if left else "Every file is fixed; submit.")
    return " ".join(parts)


class OracleEngine:
    """An Engine that plays `calls`, one per turn, and answers the loop's summary request with `oracle_summary`.
    Like a real engine it refuses a turn that would not fit `window` tokens (the loop then ends the session)."""

    def __init__(self, chat, task: Task, calls: list[ToolCall], window: int) -> None:
        self.chat, self.task, self.calls, self.window = chat, task, list(calls), window
        self.done: list[ToolCall] = []
        self.request = chat.render_observation([Message(role="user", content=SUMMARY_REQUEST)])
        self.summaries = 0

    async def generate(self, prompt_ids, sampling) -> Generation:
        if list(prompt_ids[-len(self.request):]) == self.request:
            msg = Message("assistant", oracle_summary(self.task, self.done))
            self.summaries += 1
        elif self.calls:
            call = self.calls.pop(0)
            self.done.append(call)
            msg = Message("assistant", "", tool_calls=[call])
        else:
            msg = Message("assistant", "", tool_calls=[ToolCall("submit", {})])
        ids = self.chat.assistant_tokens(msg)[: sampling.max_new_tokens]
        if len(prompt_ids) + len(ids) > self.window:
            raise ValueError(f"{len(prompt_ids)} + {len(ids)} tokens do not fit the context of {self.window}")
        return Generation(ids, [0.0] * len(ids), [0] * len(ids), finish_reason="stop")


def summary_transcripts(tasks: list[Task], n: int, chat, env_factory: Callable[[], CodingEnv],
                        rollout: RolloutConfig, window: int) -> list[tuple[list[int], list[int]]]:
    """`n` scripted sessions over `tasks` (in turn) with summarization at `rollout.summarize_at` in a context of
    `window` tokens (`model.max_seq_len`); one (token ids, loss mask) example per segment. ValueError when
    summarization is off: there would be no summary to teach."""
    if not rollout.summarize_at:
        raise ValueError("summary transcripts need rollout.summarize_at > 0 (the context size that asks for a summary)")
    pool = [t for t in tasks if t.solution]
    if n and not pool:
        raise ValueError("summary transcripts need long tasks with a known solution (tasks/synth/long.py)")

    async def one(task: Task) -> list[tuple[list[int], list[int]]]:
        traj = await run_session(OracleEngine(chat, task, oracle_actions(task), window), chat, env_factory(), task, rollout)
        return [(list(s.token_ids), list(s.loss_mask)) for s in traj.segments]

    async def all_of_them() -> list[tuple[list[int], list[int]]]:
        out: list[tuple[list[int], list[int]]] = []
        for i in range(n):
            out += await one(pool[i % len(pool)])
        return out

    return asyncio.run(all_of_them())
