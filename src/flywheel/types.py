"""The data that flows between components: messages, tool calls, generations, tasks, trajectories.

Plain dataclasses, no torch: these cross process boundaries (JSON lines, Ray) and must stay
cheap to import. Token-level arrays are plain lists of ints/floats so a trajectory serialises as is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class ToolCall:
    """A structured call parsed from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class ToolCallError:
    """A tool call the model wrote that could not be used; becomes an error observation, never an exception."""

    kind: Literal["malformed_json", "unknown_tool", "bad_arguments"]
    message: str
    raw: str = ""


@dataclass
class Message:
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    name: str = ""  # tool name, for role == "tool"


@dataclass
class SamplingParams:
    """Per-request sampling. `temperature == 0` is greedy; `seed` makes sampling reproducible."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # stop strings, matched on decoded text
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Generation:
    """What an engine returns for one request; every list is per generated token."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each token under the distribution actually sampled from
    versions: list[int]  # weight version that produced each token
    routed_experts: list[list[list[int]]] | None = None  # [token][layer][k] for MoE models
    finish_reason: Literal["stop", "length", "aborted"] = "length"
    prompt_len: int = 0
    ttft_s: float = 0.0


@dataclass
class TaskLimits:
    max_turns: int | None = None
    timeout_s: float | None = None


@dataclass
class Task:
    """A coding task: a workspace, a problem, visible tests, hidden tests and how to run them.

    `files` maps workspace-relative paths to contents; alternatively `repo` + `commit` name a local git
    repository. `hidden_files` are written over the workspace at grading only (test files restored,
    or a SWE-bench `test_patch` applied); the agent never sees them. `fail_to_pass` and `pass_to_pass`
    are test ids as pytest reports them (`tests/test_x.py::test_y`). `python_env` names a per-repository
    virtual environment, bound read-only into the sandbox, whose Python runs the tests.
    """

    id: str
    problem: str
    files: dict[str, str] = field(default_factory=dict)
    repo: str | None = None
    commit: str | None = None
    visible_tests: list[str] = field(default_factory=list)
    hidden_files: dict[str, str] = field(default_factory=dict)
    test_patch: str | None = None
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    test_command: str = "python -m pytest -q"
    limits: TaskLimits = field(default_factory=TaskLimits)
    solution: dict[str, str] | None = None  # known fix (files), for oracle tests and mid-training data
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. split, difficulty, mutation kind
    # services started in the task's network namespace for the session and its grading (sandbox/services.py),
    # e.g. [{"kind": "postgres", "database": "app"}]
    services: list[dict[str, Any]] = field(default_factory=list)
    # The task's own Python environment (tasks/repoenv.py): {"python": "3.11", "requirements": [...], "name": ...},
    # built once per distinct spec by `flywheel envs build`; None = the run's own Python runs the tests.
    python_env: dict[str, Any] | None = None
    # Tests as data (tasks/datatests.py): calls the trusted grader makes and checks itself (envs/calls.py). A task
    # with calls is graded by them alone; its test files stay for the agent's own runs.
    calls: list[dict[str, Any]] = field(default_factory=list)
    # A test as a trusted program (tasks/datatests.py `check_program`): {"id", "module", "function", "source"}; the
    # grader runs `source`'s `check(candidate)` in a sandbox of its own, each call relayed as data to the function
    # in the candidate's (envs/checks.py). For tests that are not plain calls (HumanEval's loops and helpers).
    check: dict[str, str] | None = None


@dataclass
class Reward:
    value: float
    components: dict[str, float] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # anti-cheat flags raised
    tests: dict[str, str] = field(default_factory=dict)  # test id -> passed/failed/error/skipped/missing
    notes: list[str] = field(default_factory=list)  # why a flag was raised (grading integrity), for people


@dataclass
class Segment:
    """One context window of a session. Loss mask 1 on sampled tokens, 0 on prompt and observations."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # sampler log-probs; 0.0 where loss_mask == 0
    versions: list[int]  # weight version per token; -1 where loss_mask == 0
    routed_experts: list[list[list[int]]] | None = None  # [token][layer][k] for MoE, [] where not sampled


@dataclass
class Trajectory:
    task_id: str
    group_id: str
    segments: list[Segment] = field(default_factory=list)
    reward: Reward | None = None
    num_turns: int = 0
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    env_failure: str | None = None  # set when the session broke outside the policy
    timings: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def graded(self) -> Reward:
        """The reward, for code that runs after grading (the buffer, the trainer, the metrics)."""
        if self.reward is None:
            raise ValueError(f"trajectory of task {self.task_id!r} (group {self.group_id}) has not been graded")
        return self.reward

    @property
    def min_version(self) -> int:
        versions = [v for s in self.segments for v, m in zip(s.versions, s.loss_mask) if m]
        return min(versions) if versions else -1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        if d.get("reward") is not None:
            d["reward"] = Reward(**d["reward"])
        return cls(**d)
