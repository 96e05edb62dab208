"""Grading by a check program: the task's test code in one sandbox, the candidate's function in another, plain data
between them, relayed by this process.

    status, components = grade_check(task, base, cfg, kind="auto")   # base: a private copy of the workspace

Why: a test that is a program rather than a list of calls (HumanEval's loops over random inputs, the prompt's
helpers, `assert candidate(x) == f(x)`) cannot be turned into (call, expected) data, and running it beside the
code under test gives that code the verdict (it can patch the test, its helpers or the assert). Here:

* the check sandbox holds only trusted files: the task's program (`task.check["source"]`), tasks/checker.py and
  tasks/callee.py's encoding; it runs `check(candidate)` and decides pass or fail itself;
* the candidate sandbox (a fresh one on a copy of the agent's workspace, the task's own Python) runs
  tasks/callee.py `serve`, which calls the entry point with the inputs it is sent; it never holds the program;
* this process carries each call from the first to the second and each answer back, after decoding it into fresh
  builtin values and encoding it again: an object of the candidate's own class, a subclass of a builtin or
  anything else with no plain encoding cannot cross (that call fails), and a reply that does not parse is a
  failed call. A candidate that never answers runs into the grading deadline: the check fails.

So the code under test reaches the verdict only through the values its function returns. What it does not
cover: the candidate sees every input it is called with (a program that passes the expected value as an input
gives it away), and the program's text is public when the task is (HumanEval).

The verdict's price: a second sandbox and one round trip through this process per call (`flywheel bench redteam`
`grade_ms_p50`). Tests: tests/unit/test_checks.py, tests/redteam/test_humaneval.py.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.sandbox.workspace import base_permissions
from flywheel.tasks import callee, checker
from flywheel.tasks.repoenv import ready_env
from flywheel.types import Task

_CALLEE = Path(callee.__file__).read_text(encoding="utf-8")
_CHECKER = Path(checker.__file__).read_text(encoding="utf-8")
MAX_LINE = 16 << 20  # the longest message either side may send (bytes)


class _Lines:
    """Lines from a pipe, each read by a deadline: None at end of file, at the deadline or past MAX_LINE."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof = False
        os.set_blocking(fd, False)

    def read(self, deadline: float) -> bytes | None:
        while (i := self.buf.find(b"\n")) < 0:
            left = deadline - time.monotonic()
            if self.eof or len(self.buf) > MAX_LINE or left <= 0:
                return None
            if not select.select([self.fd], [], [], left)[0]:
                return None
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            self.eof = not chunk
            self.buf += chunk
        line = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return line


def _send(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of `data` by the deadline (the reader may never read); False when it cannot."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            return False
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:  # the reader is gone
            return False
    return True


def _answer(line: bytes | None) -> dict[str, Any]:
    """The reply the check program gets for the candidate's `line`: its value re-encoded from fresh builtins, or
    a failed call."""
    if line is None:
        return {"ok": False, "error": "the candidate's process sent no reply"}
    try:
        reply = json.loads(line)
        if type(reply) is not dict or reply.get("ok") is not True:
            error = reply.get("error") if type(reply) is dict else None
            return {"ok": False, "error": str(error)[:300] if isinstance(error, str) else "the call failed"}
        return {"ok": True, "value": callee.encode(callee.decode(reply.get("value")))}
    except (ValueError, TypeError, RecursionError):
        return {"ok": False, "error": "the reply is not a plain value"}


def converse(check: subprocess.Popen, cand: subprocess.Popen, module: str, function: str,
             deadline: float) -> tuple[str, dict[str, float]]:
    """Carry calls from the check program to the candidate and answers back until the program says done;
    (the test's status, components)."""
    assert check.stdin and check.stdout and cand.stdin and cand.stdout
    from_check, from_cand = _Lines(check.stdout.fileno()), _Lines(cand.stdout.fileno())
    to_check, to_cand = check.stdin.fileno(), cand.stdin.fileno()
    calls, cand_alive = 0, True
    while True:
        line = from_check.read(deadline)
        if line is None:
            return "failed", {"check_calls": float(calls), **(
                {"timed_out": 1.0} if time.monotonic() >= deadline else {"bad_report": 1.0})}
        try:
            msg = json.loads(line)
            assert type(msg) is dict
        except (ValueError, AssertionError):
            return "error", {"check_calls": float(calls), "bad_report": 1.0}
        if msg.get("done") is True:
            return ("passed" if msg.get("passed") is True else "failed"), {"check_calls": float(calls)}
        calls += 1
        request = json.dumps({"module": module, "function": function, "args": msg.get("call")}).encode() + b"\n"
        cand_alive = cand_alive and _send(to_cand, request, deadline)
        reply = from_cand.read(deadline) if cand_alive else None
        if time.monotonic() >= deadline:
            return "failed", {"check_calls": float(calls), "timed_out": 1.0}
        cand_alive = cand_alive and reply is not None  # ended, or a line past MAX_LINE: no later reply is its own
        answer = _answer(reply)
        if not _send(to_check, json.dumps(answer).encode() + b"\n", deadline):
            return "failed", {"check_calls": float(calls), "timed_out": 1.0}


def grade_check(task: Task, base: Path, cfg: EnvConfig, kind: str = "auto") -> tuple[dict[str, str], dict[str, float]]:
    """Run `task.check` against `base` (a private copy of the agent's workspace that the caller owns and removes);
    (status of the check's test id, components)."""
    spec = task.check
    assert spec is not None
    env_dir = ready_env(task.python_env, cfg.python_envs_dir) if task.python_env is not None else None
    limits = SandboxLimits.for_grading(cfg)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-check-"))
    try:
        program = tmp / "check"
        program.mkdir()
        (program / "check.json").write_text(json.dumps({"source": spec["source"], "function": spec["function"]}),
                                            encoding="utf-8")
        (program / "callee.py").write_text(_CALLEE, encoding="utf-8")
        (program / "checker.py").write_text(_CHECKER, encoding="utf-8")
        base_permissions(program)
        base_permissions(base)
        deadline = time.monotonic() + cfg.grade_timeout_s
        with create_sandbox(base, limits, kind=kind, python_env=env_dir) as cand_sb, \
                create_sandbox(program, limits, kind=kind) as check_sb, \
                cand_sb.process(f"python -I -c {shlex.quote(_CALLEE)} serve") as cand, \
                check_sb.process("python -I checker.py") as check:
            status, extra = converse(check, cand, spec["module"], spec["function"], deadline)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {spec["id"]: status}, {"check_verdict": 1.0, **extra}
