"""CodingEnv: the message-level environment the agent loop talks to (sandbox + harness + reward).

    env = CodingEnv(cfg.env, cache_dir=Path("runs/x/task_cache"))
    messages = env.reset(task)                            # [system, user]
    observations, done = env.step(tool_calls, errors)     # one tool message per call / error
    reward = env.grade()                                  # hidden tests in a fresh sandbox
    env.close()
    CodingEnv(cfg.env, cache_dir, grader=pool)            # grade elsewhere (orchestrator/grader.py)

Synchronous by design: every method does blocking file and process work, and the async agent loop calls
it through `asyncio.to_thread`, so one slow test run never stalls the event loop that batches decoding.
A task's base workspace is materialised once per task (`task_base_dir`, cached under `cache_dir`) and each
`reset` gets a private copy-on-write sandbox over it. A malformed tool call (`ToolCallError`) becomes an
error observation and the session goes on; only `submit` ends it (the agent loop adds turn/token limits).
A task's `services` (a database: `sandbox/services.py`) start at `reset` in a network namespace of the session's
own, where its commands and the hidden tests run too, and stop at `close`; such a task always grades here.
Grading runs `reward.grade` on the sandbox's workspace in this process unless a `grader` is given; then only
the agent's changes (`envs/changes.py`) and the tool log are handed to it (the Ray backend's
grader actors rebuild the workspace from the task and grade it there, with the same result).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs.changes import call_grader, capture_changes
from flywheel.envs.judge import combine
from flywheel.envs.reward import grade, unsubmitted, workspace_diff
from flywheel.envs.tools import Harness, tools_for
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.sandbox.services import TaskServices, parse_services, start_services
from flywheel.tasks.loaders import task_base_dir
from flywheel.types import Message, Reward, Task, ToolCall, ToolCallError

# Compact: every token counts for the tiny demo model (~600 tokens for a whole easy session). The tool
# schemas are listed by the chat format after this text.
SYSTEM_COMPACT = "Fix the bug. Use the tools, then call submit."
SYSTEM_FULL = (
    "You are a software engineer fixing a bug in the repository in your workspace. Read the relevant code "
    "with `view` and `search`, make the smallest correct change with `str_replace` (or `write`), check it "
    "with `run_tests` or `bash`, and call `submit` when you are done. Do not edit the tests: they are "
    "restored before grading, and hidden tests decide the result.")
NO_CALL = "No tool call found. Call a tool, or submit."


def system_prompt(cfg: EnvConfig) -> str:
    return SYSTEM_COMPACT if cfg.system_prompt == "compact" else SYSTEM_FULL


class CodingEnv:
    """One session at a time: `reset(task)` (closing any previous one), `step`, `grade`, `close`."""

    def __init__(self, cfg: EnvConfig, cache_dir: str | Path, sandbox_kind: str = "auto", *,
                 judge: Any = None, loop: asyncio.AbstractEventLoop | None = None, grader: Any = None) -> None:
        """`judge` (a `RubricJudge`) is consulted by `grade` when `cfg.rubric_weight > 0`; `loop` is the event
        loop its engine runs on (the env is called from worker threads, so the judge's coroutine is
        submitted to that loop); without `loop` the judge runs in a private `asyncio.run`. `grader` (None:
        `reward.grade` here, on the sandbox's workspace) is a `Grader` or callable
        `(task, changes, tool_log) -> Reward` that gets the agent's changes instead of the directory."""
        if not isinstance(cfg, EnvConfig):
            raise TypeError(f"cfg must be an EnvConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tools = tools_for(cfg)  # the schemas to give the chat format
        self.cache_dir = Path(cache_dir)
        self.sandbox_kind = sandbox_kind if sandbox_kind != "auto" else cfg.sandbox
        self.task: Task | None = None
        self.sandbox: Any = None
        self.harness: Harness | None = None
        self.done = False
        self.reward: Reward | None = None
        self.judge, self.loop = judge, loop
        self.grader = grader
        self.base: Path | None = None  # the task's base workspace (what a remote grader rebuilds from)
        self.services: TaskServices | None = None  # the task's services (a live database), for one session
        if cfg.rubric_weight > 0 and judge is None:
            raise ValueError("env.rubric_weight > 0 needs a RubricJudge: pass CodingEnv(..., judge=RubricJudge(...))")

    def reset(self, task: Task) -> list[Message]:
        self.close()
        base = task_base_dir(task, self.cache_dir)
        self.base = base
        if task.services:  # started before the session, in the task's own network namespace; ready on return
            self.services = start_services(parse_services(task.services))
        svc = self.services
        self.sandbox = create_sandbox(base, SandboxLimits.from_config(self.cfg), kind=self.sandbox_kind,
                                      netns_fd=None if svc is None else svc.netns, env=None if svc is None else svc.env)
        self.task, self.done, self.reward = task, False, None
        self.harness = Harness(self.sandbox, self.cfg, task)
        return [Message("system", system_prompt(self.cfg)), Message("user", task.problem)]

    def step(self, tool_calls: list[ToolCall], errors: list[ToolCallError] | tuple = ()) -> tuple[list[Message], bool]:
        if self.harness is None:
            raise RuntimeError("call reset(task) before step()")
        out: list[Message] = []
        for err in errors:
            out.append(Message("tool", self.harness.error_observation(err), name="error"))
        for call in tool_calls:
            res = self.harness.call(call)
            out.append(Message("tool", res.output, name=call.name if isinstance(call.name, str) else "error"))
            if res.done:
                self.done = True
                break  # calls after submit in the same turn are not run
        if not out:
            self.harness.num_errors += 1
            out.append(Message("user", NO_CALL))
        return out, self.done

    def grade(self) -> Reward:
        """The session's reward (computed once; later calls return the same object)."""
        if self.harness is None or self.task is None or self.base is None:
            raise RuntimeError("call reset(task) before grade()")
        if self.reward is None:
            ws = Path(self.sandbox.workspace)
            # Not submitted under require_submit: the test credit is withheld anyway, so no sandbox is spent
            # on the tests (flags and their penalty still count).
            untested = self.cfg.require_submit and not self.done and not self.cfg.test_unsubmitted
            # A task with services grades here, beside its live services (a remote grader has none of them).
            if self.grader is None or untested or self.services is not None:
                reward = grade(self.task, ws, self.cfg, tool_log=self.harness.log, kind=self.sandbox_kind,
                               run_tests=not untested, services=self.services)
            else:
                assert self.base is not None  # set by reset
                changes = capture_changes(self.base, ws)
                reward = call_grader(self.grader, self.task, changes, list(self.harness.log))
            if self.judge is not None and self.cfg.rubric_weight > 0:
                coro = self.judge.score(self.task, diff=workspace_diff(self.task, ws))
                if self.loop is not None:
                    score = asyncio.run_coroutine_threadsafe(coro, self.loop).result()
                else:
                    score = asyncio.run(coro)
                reward = combine(reward, score, self.cfg)
            if self.cfg.require_submit and not self.done:
                reward = unsubmitted(reward)
            self.reward = reward
        return self.reward

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = dict(self.harness.metrics()) if self.harness else {}
        if self.reward is not None:
            for flag in self.reward.flags:
                m[f"flag_{flag}"] = 1.0
        return m

    def close(self) -> None:
        try:
            if self.sandbox is not None:
                self.sandbox.close()
        finally:
            if self.services is not None:
                self.services.close()  # every service process killed, its data removed
            self.sandbox, self.harness, self.services = None, None, None

    def __enter__(self) -> CodingEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
