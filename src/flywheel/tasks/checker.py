"""The trusted side of a check program: run a task's `check(candidate)` where `candidate` is a call to the grader.

    python -I checker.py            # in its own sandbox; cwd holds check.json, callee.py and this file
    check.json: {"source": "<the check program>", "function": "<the entry point>"}
    stdout:     {"call": <encoded args>}\n ... then {"done": true, "passed": true|false, "error": "..."}\n
    stdin:      one reply per call: {"ok": true, "value": <encoded>} | {"ok": false, "error": "..."}

Why: some tests are programs, not a list of calls (HumanEval's loops over random inputs, helpers of the prompt,
`assert candidate(x) == f(x)`). This process runs such a program, and nothing else: no file of the candidate's
workspace is here, and the candidate's function lives in another sandbox (tasks/callee.py `serve`). Each call
of `candidate` goes out as plain data, and what comes back was decoded by the grader (envs/checks.py) into fresh
builtin values, so the code under test can affect this process only through the values its function returns,
and the comparisons in `check` are the ones the task wrote. The program's own names (the prompt's helpers) are
its own; the entry point's name is bound to `candidate` too, as in the official harness, where a check may call
the function by name. `random` is seeded, so a program that draws inputs draws the same ones every grading.

This file must stay importable with the standard library alone: it runs in a sandbox where flywheel is not
installed. Tests: tests/unit/test_checks.py.
"""

from __future__ import annotations

import json
import os
import random
import sys


class CandidateError(Exception):
    """A call of the candidate failed: it raised, returned a value with no plain encoding, or its process ended."""


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the request channel; the program's own prints go to stderr
    os.dup2(2, 1)
    sys.path.insert(0, os.getcwd())
    from callee import decode, encode  # type: ignore[import-not-found]  # beside this file, written by the grader

    with open("check.json", encoding="utf-8") as f:
        spec = json.load(f)
    replies = sys.stdin

    def candidate(*args):
        out.write(json.dumps({"call": encode(args)}) + "\n")
        out.flush()
        reply = json.loads(replies.readline() or "{}")
        if reply.get("ok") is not True:
            raise CandidateError(str(reply.get("error", "no reply"))[:300])
        return decode(reply["value"])

    random.seed(0)
    namespace: dict = {"__name__": "__check__"}
    try:
        exec(compile(spec["source"], "check.py", "exec"), namespace)  # noqa: S102 - the task's own test program
        namespace[spec["function"]] = candidate
        namespace["check"](candidate)
    except BaseException as err:  # noqa: BLE001 - any failure of the program is a failed check
        verdict = {"done": True, "passed": False, "error": f"{type(err).__name__}: {err}"[:300]}
    else:
        verdict = {"done": True, "passed": True}
    out.write(json.dumps(verdict) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
