"""The trusted side of a check program: run a task's `check(candidate)` where `candidate` is a call to the grader.

    python -I -S checker.py         # in its own sandbox; cwd holds check.json, callee.py and this file
    check.json: {"source": "<the check program>", "module": "<the candidate's module>", "function": "<entry point>"}
    stdout:     one request per call, to the candidate's process: {"module": ..., "function": ..., "args": <encoded>}
    stdin:      one reply per call, from it: {"ok": true, "value": <encoded>} | {"ok": false, "error": "..."}
    stderr:     the verdict, to the grader: {"done": true, "passed": true|false, "calls": n, "error": "..."}

Why: some tests are programs, not a list of calls (HumanEval's loops over random inputs, helpers of the prompt,
`assert candidate(x) == f(x)`). This process runs such a program, and nothing else: no file of the candidate's
workspace is here, and the candidate's function lives in another sandbox (tasks/callee.py `serve`), joined to
this one by two pipes the grader made (envs/checks.py). Each call of `candidate` goes out as plain data, and what
comes back is decoded here into fresh builtin values (an object of the candidate's own class, a builtin subclass,
a line that does not parse or one past MAX_LINE is a failed call; after an unreadable line, or once the
candidate's process is gone, every later call fails too). So the code under test can affect this process only
through the values its function returns, and the comparisons in `check` are the ones the task wrote. The verdict
goes to the grader on a third channel (stderr) that the candidate's process holds no end of. The program's own
names (the prompt's helpers) are its own; the entry point's name is bound to `candidate` too, as in the official
harness, where a check may call the function by name. `random` is seeded, so a program that draws inputs draws
the same ones every grading.

This file must stay importable with the standard library alone: it runs in a sandbox where flywheel is not
installed. Tests: tests/unit/test_checks.py.
"""

from __future__ import annotations

import json
import os
import random
import sys

MAX_LINE = 16 << 20  # the longest reply the candidate may send (bytes); envs/checks.py reads it too


class CandidateError(Exception):
    """A call of the candidate failed: it raised, returned a value with no plain encoding, or its process ended."""


def answer(line: bytes, decode) -> object:
    """The value the candidate's reply `line` carries, built from fresh builtins by `decode` (callee.decode);
    CandidateError for a failed call, ValueError or TypeError for a reply that is not plain data."""
    reply = json.loads(line)
    if type(reply) is not dict or reply.get("ok") is not True:
        error = reply.get("error") if type(reply) is dict else None
        raise CandidateError(str(error)[:300] if isinstance(error, str) else "the call failed")
    return decode(reply.get("value"))


def main() -> int:
    requests = os.fdopen(os.dup(1), "w")  # to the candidate's process
    verdict_out = os.fdopen(os.dup(2), "w")  # to the grader
    quiet = os.open(os.devnull, os.O_WRONLY)  # the program's own prints go nowhere
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    replies = os.fdopen(os.dup(0), "rb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the program reads no reply by accident
    sys.path.insert(0, os.getcwd())
    from callee import decode, encode  # type: ignore[import-not-found]  # beside this file, written by the grader

    with open("check.json", encoding="utf-8") as f:
        spec = json.load(f)
    state = {"calls": 0, "alive": True}

    def candidate(*args):
        state["calls"] += 1
        if not state["alive"]:
            raise CandidateError("the candidate's process is gone")
        try:
            requests.write(json.dumps({"module": spec["module"], "function": spec["function"],
                                       "args": encode(args)}) + "\n")
            requests.flush()
            line = replies.readline(MAX_LINE + 1)
        except OSError as err:  # its end of the pipe is closed
            state["alive"] = False
            raise CandidateError("the candidate's process is gone") from err
        if not line.endswith(b"\n"):  # it ended, or sent a line past MAX_LINE: no later line is its own reply
            state["alive"] = False
            raise CandidateError("the candidate's process sent no reply")
        try:
            return answer(line, decode)
        except (ValueError, TypeError, RecursionError) as err:
            raise CandidateError("the reply is not a plain value") from err

    random.seed(0)
    namespace: dict = {"__name__": "__check__"}
    try:
        exec(compile(spec["source"], "check.py", "exec"), namespace)  # noqa: S102 - the task's own test program
        namespace[spec["function"]] = candidate
        namespace["check"](candidate)
    except BaseException as err:  # noqa: BLE001 - any failure of the program is a failed check
        verdict = {"done": True, "passed": False, "calls": state["calls"], "error": f"{type(err).__name__}: {err}"[:300]}
    else:
        verdict = {"done": True, "passed": True, "calls": state["calls"]}
    verdict_out.write(json.dumps(verdict) + "\n")
    verdict_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
