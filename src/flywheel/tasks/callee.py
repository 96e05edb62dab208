"""The candidate side of function-level grading: call the workspace's functions and send back plain data.

    python -I -c "$(cat callee.py)" < request.json        # in the grading sandbox, cwd = the workspace
    request: {"calls": [{"module": "calc", "function": "f", "args": <encoded>}, ...]}
    stdout:  {"results": [{"i": 0, "ok": true, "value": <encoded>} | {"i": 1, "ok": false, "error": "..."}, ...]}

    python -I -c "$(cat callee.py)" serve calc            # one call per line in, one reply per line out
    stdin:   {"module": "calc", "function": "f", "args": <encoded>}         (tasks/checker.py sends these)
    stdout:  {"ok": true, "value": <encoded>} | {"ok": false, "error": "..."}

Why: a verdict decided inside the interpreter that runs the code under test belongs to that code (it can patch
the runner, the report or any guard beside it). Here that interpreter only ever holds the inputs; the expected
values stay with the trusted grader (envs/calls.py), which decodes what comes back into fresh builtin values and
compares them itself. Nothing this file does is trusted: code under test may replace it, print over its output
or exit early, and all it can achieve is to send other values, which it would have to know to be right.

The encoding carries exact builtin types only: None, bool, int, float, str, bytes as themselves or tagged
objects ({"tuple": [...]}, {"list": [...]}, {"dict": [[k, v], ...]}, {"set": [...]}, {"frozenset": [...]},
{"bytes": "hex"}, {"float": "nan"|"inf"|"-inf"}). A value of any other type, a subclass included (an object
whose `__eq__` says yes to everything), cannot be encoded: that call fails.

This file must stay importable with the standard library alone: it runs inside the sandbox, where flywheel is
not installed. Tests: tests/unit/test_calls.py.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys

MAX_DEPTH = 64


def encode(value, depth: int = 0):
    """`value` as JSON-able data; TypeError for anything that is not an exact builtin value."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is bytes:
        return {"bytes": value.hex()}
    if t in (list, tuple, set, frozenset):
        items = [encode(v, depth + 1) for v in value]
        if t in (set, frozenset):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return {t.__name__: items}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"a {t.__module__}.{t.__qualname__} is not a plain builtin value")


def decode(data, depth: int = 0):
    """The value `encode` made `data` from, built from fresh builtin objects; ValueError on anything else."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(data)
    if data is None or t in (bool, int, str, float):
        return data
    if t is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    (tag, body), = data.items()
    if tag in ("list", "tuple", "set", "frozenset") and type(body) is list:
        items = [decode(v, depth + 1) for v in body]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(body) is list:
        pairs = [(decode(p[0], depth + 1), decode(p[1], depth + 1)) for p in body if type(p) is list and len(p) == 2]
        if len(pairs) != len(body):
            raise ValueError("a dict entry is not a [key, value] pair")
        return dict(pairs)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    raise ValueError(f"unknown tag {tag!r}")


def _call(i: int, entry: dict) -> dict:
    try:
        module = importlib.import_module(entry["module"])
        fn = getattr(module, entry["function"])
        args = decode(entry["args"])
        return {"i": i, "ok": True, "value": encode(fn(*args))}
    except BaseException as err:  # noqa: BLE001 - any failure of the candidate is that call's result
        return {"i": i, "ok": False, "error": f"{type(err).__name__}: {err}"[:300]}


def serve(out, modules: list[str]) -> None:
    """Answer calls one line at a time until stdin ends: the candidate side of a check program. `modules` are
    imported first, while the check program starts (an import that fails is reported by the first call)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001, S110 - the call that needs it says why
            pass
    for line in sys.stdin:
        reply = _call(0, json.loads(line))
        del reply["i"]
        try:
            text = json.dumps(reply)
        except ValueError as err:  # an int too long for str(): that call fails
            text = json.dumps({"ok": False, "error": f"ValueError: {err}"[:300]})
        out.write(text + "\n")
        out.flush()


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # the reply channel; fd 1 itself goes to stderr, so the code's prints do not
    os.dup2(2, 1)                    # land in the reply (nothing here is trusted: this is for honest code)
    sys.path.insert(0, os.getcwd())
    if sys.argv[1:2] == ["serve"]:
        serve(out, sys.argv[2:])
        return 0
    request = json.loads(sys.stdin.read())
    results = [_call(i, entry) for i, entry in enumerate(request["calls"])]
    out.write(json.dumps({"results": results}))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
