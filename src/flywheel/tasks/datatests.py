"""Tests as data: the call entries that function-level grading (envs/calls.py) runs, built, checked and derived.

    entry = call("test_calc_hidden.py::test_h0", "calc", "f", (3, [1, 2]), 7)     # one encoded call
    problem = check_call(entry)                                                   # None, or what to change
    entries = humaneval_calls(record["test"], "solution", record["entry_point"], "test_solution.py::test_check")
    spec = humaneval_check(record["prompt"], record["test"], "solution", record["entry_point"],
                           "test_solution.py::test_check")    # the program form, where entries is None

An entry is {"id", "module", "function", "args", "expected", "compare", "tol"}; args and expected are in
tasks/callee.py's encoding. Entries may share an id: that test passes only when every one of its calls does
(HumanEval's `check` is one test of many asserts). A test that is not plain calls can be a check program instead
(`check_program`, graded by envs/checks.py). Why a separate file: the generator and the loaders build
entries (this layer); the trusted grader that compares them lives above, in envs/.
"""

from __future__ import annotations

import ast
import builtins
import operator
from typing import Any

from flywheel.tasks import callee

COMPARES = ("eq", "close", "truthy", "falsy")
KEYS = ("id", "module", "function", "args", "expected", "compare", "tol")


def call(test_id: str, module: str, function: str, args: tuple, expected: Any = None, compare: str = "eq",
         tol: float | None = None) -> dict[str, Any]:
    """One call entry, encoded (what the synthetic generator and the HumanEval loader write)."""
    entry: dict[str, Any] = {"id": test_id, "module": module, "function": function, "args": callee.encode(args),
                             "compare": compare}
    if compare in ("eq", "close"):
        entry["expected"] = callee.encode(expected)
    if tol is not None:
        entry["tol"] = float(tol)
    return entry


def check_call(entry: Any) -> str | None:
    """Why `entry` is not a well-formed call (a message naming the field to change), or None."""
    if not isinstance(entry, dict):
        return "each entry of 'calls' must be an object"
    for key in ("id", "module", "function"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"calls[].{key} must be a non-empty string"
    unknown = set(entry) - set(KEYS)
    if unknown:
        return f"calls[] has unknown keys {sorted(unknown)}; allowed: {list(KEYS)}"
    compare = entry.get("compare", "eq")
    if compare not in COMPARES:
        return f"calls[].compare must be one of {COMPARES}, got {compare!r}"
    if "tol" in entry and (type(entry["tol"]) not in (int, float) or not entry["tol"] > 0):
        return f"calls[] {entry['id']!r}: tol must be a positive number"
    try:
        args = callee.decode(entry.get("args", {"tuple": []}))
        if compare in ("eq", "close"):
            callee.decode(entry.get("expected"))
    except (ValueError, TypeError) as err:
        return f"calls[] {entry['id']!r}: {err}"
    if type(args) is not tuple:
        return f"calls[] {entry['id']!r}: args must encode a tuple"
    return None


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_SCALARS = (int, float, str)
_MAX_CONST = 10_000  # the longest string and the largest exponent a constant expression may build


def constant(node: ast.expr) -> Any:
    """The value of a constant expression: a literal, or arithmetic on numbers and strings (`3 * 19`, `2.0/3.0`,
    `'ab' + 'c'`, `0**0`) inside tuples and lists, folded here with bounded sizes. ValueError for anything else
    (names, calls, comprehensions): those keep a test on the in-process path."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = constant(node.operand)
        if type(v) not in (int, float):
            raise ValueError("a sign on a non-number")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        a, b = constant(node.left), constant(node.right)
        if type(a) not in _SCALARS or type(b) not in _SCALARS:
            raise ValueError("arithmetic on a non-scalar")
        if isinstance(node.op, ast.Pow) and (type(b) is not int or abs(b) > 64 or abs(a) > _MAX_CONST):
            raise ValueError("a power too large to fold")
        if isinstance(node.op, ast.Mult) and (str in (type(a), type(b))) and (
                (type(a) is str and (type(b) is not int or len(a) * b > _MAX_CONST))
                or (type(b) is str and (type(a) is not int or len(b) * a > _MAX_CONST))):
            raise ValueError("a string repetition too long to fold")
        try:
            return _ARITH[type(node.op)](a, b)
        except (TypeError, ZeroDivisionError, OverflowError) as err:
            raise ValueError(str(err)) from err
    raise ValueError(f"not a constant expression: {type(node).__name__}")


def _candidate_call(node: ast.expr) -> tuple | None:
    """The constant arguments of `candidate(<constants>)`, or None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "candidate"
            and not node.keywords):
        return None
    try:
        return tuple(constant(a) for a in node.args)
    except (ValueError, RecursionError):
        return None


def _entry(test: ast.expr) -> tuple[tuple, str, Any, float | None] | None:
    """(args, compare, expected, tol) of one HumanEval assert, or None when it is not a plain call."""
    args = _candidate_call(test)
    if args is not None:
        return args, "truthy", None, None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        args = _candidate_call(test.operand)
        return (args, "falsy", None, None) if args is not None else None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        for a, b in ((left, right), (right, left)):
            args = _candidate_call(a)
            if args is not None:
                if isinstance(op, ast.Is) and not (isinstance(b, ast.Constant) and b.value in (True, False, None)):
                    return None
                try:
                    return args, "eq", constant(b), None
                except (ValueError, RecursionError):
                    return None
        return None
    # abs(candidate(...) - expected) < tol
    if (isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name)
            and left.func.id == "abs" and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)):
        args = _candidate_call(left.args[0].left)
        try:
            expected, tol = constant(left.args[0].right), constant(right)
        except (ValueError, RecursionError):
            return None
        if args is not None and type(expected) in (int, float) and type(tol) in (int, float) and tol > 0:
            return args, "close", expected, float(tol)
    return None


def humaneval_calls(test: str, module: str, entry_point: str, test_id: str) -> list[dict[str, Any]] | None:
    """HumanEval's `check(candidate)` as call entries (all under `test_id`), or None where any statement of it
    is not `assert <plain call and comparison>` on constant expressions (`constant`): loops, helpers and values
    computed by calls keep the in-process path.
    Only the `check` body's asserts are read; `assert True` and docstrings are skipped."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        return None
    out: list[dict[str, Any]] = []
    for stmt in checks[0].body:
        if isinstance(stmt, ast.Expr) and (isinstance(stmt.value, ast.Constant) or (
                isinstance(stmt.value, ast.Name) and stmt.value.id in vars(builtins))):
            continue  # a docstring, or a bare builtin name (`print`): nothing a test checks
        if not isinstance(stmt, ast.Assert):
            return None
        if isinstance(stmt.test, ast.Constant) and stmt.test.value is True:
            continue
        got = _entry(stmt.test)
        if got is None:
            return None
        args, compare, expected, tol = got
        try:
            out.append(call(test_id, module, entry_point, args, expected, compare, tol))
        except (TypeError, RecursionError):
            return None
    return out or None


CHECK_KEYS = ("id", "module", "function", "source")


def check_program(spec: Any) -> str | None:
    """Why `spec` (a task's `check`, envs/checks.py) is not a well-formed check program (what to change), or None."""
    if not isinstance(spec, dict):
        return "field 'check' must be an object {" + ", ".join(CHECK_KEYS) + "}"
    if set(spec) != set(CHECK_KEYS):
        return f"field 'check' must have exactly the keys {list(CHECK_KEYS)} (got {sorted(spec)})"
    for key in CHECK_KEYS:
        if not isinstance(spec[key], str) or not spec[key]:
            return f"check.{key} must be a non-empty string"
    if not spec["function"].isidentifier():
        return f"check.function {spec['function']!r} is not a Python identifier"
    try:
        tree = ast.parse(spec["source"])
    except SyntaxError as err:
        return f"check.source does not parse: {err}"
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        return "check.source must define `check(candidate)` at module level"
    return None


def humaneval_check(prompt: str, test: str, module: str, entry_point: str, test_id: str) -> dict[str, str] | None:
    """HumanEval's `check` as a check program: the prompt (its imports and helpers, with the entry point a stub
    that the relay replaces by the candidate) followed by the test. None when that does not parse."""
    spec = {"id": test_id, "module": module, "function": entry_point, "source": f"{prompt}\n\n{test}\n"}
    return None if check_program(spec) else spec
