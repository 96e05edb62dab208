"""Grading by a check program: the task's test code in one sandbox, the candidate's function in another, plain data
between them over two pipes, and the verdict on a third that only the check program writes.

    status, components = grade_check(task, base, cfg, kind="auto")   # base: a private copy of the workspace

Why: a test that is a program rather than a list of calls (HumanEval's loops over random inputs, the prompt's
helpers, `assert candidate(x) == f(x)`) cannot be turned into (call, expected) data, and running it beside the
code under test gives that code the verdict (it can patch the test, its helpers or the assert). Here:

* the check sandbox holds only trusted files: the task's program (`task.check["source"]`), tasks/checker.py and
  tasks/callee.py's encoding; it runs `check(candidate)`, decodes each answer into fresh builtin values (an
  object of the candidate's own class, a subclass of a builtin, a line that does not parse or one past MAX_LINE is
  a failed call), and decides pass or fail itself. Its interpreter starts with `-S`: it needs the standard
  library alone;
* the candidate sandbox (a fresh one on a copy of the agent's workspace, the task's own Python) runs
  tasks/callee.py `serve`, which imports the entry point's module while the check program starts and calls it
  with the inputs it is sent; it never holds the program;
* this process makes the pipes (the check program's stdout to the candidate's stdin, the candidate's stdout to
  the check program's stdin, the check program's stderr to here) and waits, by the grading deadline, for the
  verdict line. The candidate holds no end of that pipe: whatever it writes reaches the check program as the
  reply to a call. A candidate that never answers runs into the deadline: the check fails.

So the code under test reaches the verdict only through the values its function returns. What it does not
cover: the candidate sees every input it is called with (a program that passes the expected value as an input
gives it away), and the program's text is public when the task is (HumanEval).

The verdict's price: a second sandbox and one round trip between the two programs per call (`flywheel bench
redteam` `grade_ms_p50_check`). Tests: tests/unit/test_checks.py, tests/redteam/test_humaneval.py.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from flywheel.config import EnvConfig
from flywheel.sandbox.host import kill_group
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.sandbox.workspace import base_permissions
from flywheel.tasks import callee, checker
from flywheel.tasks.repoenv import ready_env
from flywheel.types import Task

_CALLEE = Path(callee.__file__).read_text(encoding="utf-8")
_CHECKER = Path(checker.__file__).read_text(encoding="utf-8")


def read_verdict(fd: int, deadline: float) -> tuple[str, dict[str, float]]:
    """The check program's verdict, a line it writes on `fd` (its stderr) as its last act, read by the deadline;
    (the test's status, components). Other lines (bwrap saying why it could not start) are passed over."""
    os.set_blocking(fd, False)
    buf = bytearray()
    while len(buf) <= checker.MAX_LINE:
        while (i := buf.find(b"\n")) >= 0:
            line = bytes(buf[:i])
            del buf[:i + 1]
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if type(msg) is dict and msg.get("done") is True:
                calls = {"check_calls": float(msg["calls"])} if type(msg.get("calls")) is int else {}
                return ("passed" if msg.get("passed") is True else "failed"), calls
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return "failed", {"timed_out": 1.0}
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:  # it ended with no verdict
            break
        buf += chunk
    return "error", {"bad_report": 1.0}


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
        (program / "check.json").write_text(json.dumps({k: spec[k] for k in ("source", "module", "function")}),
                                            encoding="utf-8")
        (program / "callee.py").write_text(_CALLEE, encoding="utf-8")
        (program / "checker.py").write_text(_CHECKER, encoding="utf-8")
        base_permissions(program)
        base_permissions(base)
        deadline = time.monotonic() + cfg.grade_timeout_s
        pipes = [*os.pipe(), *os.pipe(), *os.pipe()]
        to_cand_r, to_cand_w, to_check_r, to_check_w, verdict_r, verdict_w = pipes  # requests, replies, verdict
        try:
            with create_sandbox(base, limits, kind=kind, python_env=env_dir) as cand_sb, \
                    create_sandbox(program, limits, kind=kind) as check_sb, \
                    cand_sb.process(f"python -I -c {shlex.quote(_CALLEE)} serve {shlex.quote(spec['module'])}",
                                    stdin=to_cand_r, stdout=to_check_w) as cand, \
                    check_sb.process("python -I -S checker.py", stdin=to_check_r, stdout=to_cand_w,
                                     stderr=verdict_w):
                for fd in pipes[:4] + [verdict_w]:  # only the two programs hold these now
                    os.close(fd)
                    pipes.remove(fd)
                status, extra = read_verdict(verdict_r, deadline)
                kill_group(cand.pid)  # now, while the check program ends, not after it
        finally:
            for fd in pipes:
                os.close(fd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {spec["id"]: status}, {"check_verdict": 1.0, **extra}
