"""Twins of parametrized tests: one row of a `@pytest.mark.parametrize` table with its expected value changed.

    twin = param_twin(source, (), "test_underscore[Product-product]", random.SystemRandom())   # None: no twin
    twin.source, twin.twin_row, twin.readers    # the file to write, the row id it reports under, what else reads it

Why: a real project's tests are mostly tables (`@pytest.mark.parametrize(("camel", "underscore"), TABLE)`), and a
test whose expected value is a parameter has no literal in its body for envs/twins.py to change. The table is
where the value lives, so the twin changes it there, in the one place the value is written: code under test that
compared the table with what the test received would find them equal in every run.

Which rows qualify, so that a correct fix always fails the twin:
* the test function has exactly one `parametrize` decorator, with no `ids=` or `indirect=`, whose values are a
  literal list or tuple written in the decorator, or a module-level name bound once to one and read at module
  level nowhere else (a table another table is built from would change both);
* its first top-level `assert <param> == <expr>` (either side) or `self.assertEqual(...)` whose one side is a
  parameter P, before any statement that can return or yield and before any other read of P, with P never
  assigned in the test and absent from the other side (so the compared value does not move with P): if the test
  passes, that statement compared the right answer with P's new value, which differs from the old one;
* P's value is a string, an integer or a boolean (a float may sit within a tolerance of its changed self), and
  every row is literal, so that its id can be computed as pytest computes it (`value_id`): all distinct, the
  row's equal to the node id's bracket (a mismatch, from `ids=` elsewhere or a plugin, means no twin).

How it changes: P's literal in that row, as envs/twins.py changes a literal (one letter or digit). pytest derives
the row's id from its values, so the twin reports under a new id (`twin_row`); the grader selects the function as a
whole in every run (node ids of rows would not survive the change) and reads each id it wants from the report.
The tests that read the changed table see the changed row in the twin run, and the grader takes none of their
statuses from that run: the row's own test in each function whose one parametrize table it is (`row_readers`),
every test of a function that reads it otherwise (`readers`), and every test of another file that names it.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass

from flywheel.envs.twins import changed, compared_name, function_def, line_offsets, reads

_VALUE_TYPES = (str, int, bool)
Key = tuple[tuple[str, ...], str]  # (classes, function name) of a test function


@dataclass(frozen=True)
class ParamTwin:
    source: str  # the test file with one row's expected value changed
    twin_row: str  # the id of the changed row, which the twin reports under (`test_x[<twin_row>]`)
    row: str  # the id of the row as it is
    table: str | None  # the module-level name of the changed table (None: a list written in the decorator)
    # (classes, name) of the file's tests that read the table: as their one parametrize table (only their test
    # `[row]` sees the change), or otherwise (every one of their tests may)
    row_readers: frozenset[Key]
    readers: frozenset[Key]


def value_id(value: object, argname: str, index: int) -> str:
    """pytest's id of one parameter value (`_idval_from_value`, default escaping): a string escaped to ASCII,
    a number, bool or None as `str()` writes it, anything else `<argname><row index>`."""
    if isinstance(value, str):
        return value.encode("unicode_escape").decode("ascii")
    if isinstance(value, bytes):
        return value.decode("ascii", "backslashreplace")
    if value is None or isinstance(value, (bool, int, float, complex)):
        return str(value)
    return f"{argname}{index}"


def _parametrize(func: ast.FunctionDef) -> ast.Call | None:
    calls = [d for d in func.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
             and d.func.attr == "parametrize"]
    if len(calls) != 1 or any(k.arg in ("ids", "indirect") for k in calls[0].keywords):
        return None
    return calls[0]


def _argument(call: ast.Call, index: int, name: str) -> ast.expr | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == name), None)


def _argnames(node: ast.expr | None) -> tuple[list[str], bool] | None:
    """(names, rows are tuples) of a parametrize's first argument."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        names = [n.strip() for n in node.value.split(",") if n.strip()]
        return names, len(names) > 1
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                       for e in node.elts):
        return [e.value for e in node.elts], True  # type: ignore[attr-defined]
    return None


def _table(tree: ast.Module, node: ast.expr) -> tuple[ast.List | ast.Tuple, str | None] | None:
    """The rows' container and the module-level name it is bound to (None: written in the decorator)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return node, None
    if not isinstance(node, ast.Name):
        return None
    name = node.id
    binds = [s for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    if len(binds) != 1 or len(stores) != 1 or not isinstance(binds[0].value, (ast.List, ast.Tuple)):
        return None
    for stmt in tree.body:  # read at module level (or in a class body) only by test functions
        if stmt is binds[0] or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inner = stmt.body if isinstance(stmt, ast.ClassDef) else [stmt]
        if isinstance(stmt, ast.ClassDef) and any(reads(d, name) for d in stmt.decorator_list):
            return None
        if any(reads(s, name) for s in inner if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))):
            return None
    return binds[0].value, name


def _expected_param(func: ast.FunctionDef, names: list[str]) -> str | None:
    stored = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    stored |= {g for n in ast.walk(func) if isinstance(n, (ast.Global, ast.Nonlocal)) for g in n.names}
    return compared_name(func.body, names, stored)


def _readers(tree: ast.Module, name: str) -> tuple[frozenset[Key], frozenset[Key]]:
    """(row readers, readers) of the module-level table `name` (see ParamTwin)."""
    rows: set[Key] = set()
    other: set[Key] = set()
    for stmt in tree.body:
        for cls, body in [((), [stmt])] + ([((stmt.name,), stmt.body)] if isinstance(stmt, ast.ClassDef) else []):
            for f in body:
                if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) or not reads(f, name):
                    continue
                call = _parametrize(f)  # type: ignore[arg-type]
                table = _argument(call, 1, "argvalues") if call is not None else None
                mentions = sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(f))
                only_there = isinstance(table, ast.Name) and table.id == name and mentions == 1
                (rows if only_there and not _class_adds_params(stmt) else other).add((cls, f.name))
    return frozenset(rows), frozenset(other)


def _class_adds_params(stmt: ast.stmt) -> bool:
    """A class whose decorators or `pytestmark` may add parameters to its tests' ids."""
    if not isinstance(stmt, ast.ClassDef):
        return False
    return bool(stmt.decorator_list) or any(isinstance(s, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets) for s in stmt.body)


def param_twin(source: str, classes: tuple[str, ...], name: str, rng: random.Random) -> ParamTwin | None:
    """The twin of parametrized test `classes...name` (`test_x[row-id]`) in `source`, or None (module doc)."""
    base, bracket, rest = name.partition("[")
    if not bracket or not rest.endswith("]"):
        return None
    row_id = rest[:-1]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    func = function_def(tree, classes, base)
    call = _parametrize(func) if func is not None else None
    if func is None or call is None:
        return None
    spec, values = _argnames(_argument(call, 0, "argnames")), _argument(call, 1, "argvalues")
    found = _table(tree, values) if spec is not None and values is not None else None
    if spec is None or found is None:
        return None
    names, tupled = spec
    container, table = found
    rows: list[list[ast.expr]] = []
    for elt in container.elts:
        if tupled and not (isinstance(elt, (ast.Tuple, ast.List)) and len(elt.elts) == len(names)):
            return None
        rows.append(list(elt.elts) if tupled else [elt])  # type: ignore[attr-defined]
    ids = [_row_id([_value(v) for v in row], names, i) for i, row in enumerate(rows)]
    param = _expected_param(func, names)
    if param is None or None in ids or len(set(ids)) != len(ids) or ids.count(row_id) != 1:
        return None
    index = ids.index(row_id)
    row = rows[index]
    node = row[names.index(param)]
    if type(ast.literal_eval(node)) not in _VALUE_TYPES or node.end_lineno is None or node.end_col_offset is None:
        return None
    raw = source.encode("utf-8", errors="surrogatepass")
    starts = line_offsets(raw)
    a, b = starts[node.lineno] + node.col_offset, starts[node.end_lineno] + node.end_col_offset
    text = raw[a:b].decode("utf-8", errors="surrogatepass")
    for _ in range(8):
        new = changed(text, rng)
        if new is None:
            return None
        new_id = _row_id([ast.literal_eval(new) if v is node else _value(v) for v in row], names, index)
        if new_id is None or new_id in ids:
            continue
        twin = (raw[:a] + new.encode("utf-8", errors="surrogatepass") + raw[b:]).decode("utf-8", "surrogatepass")
        rows_of, readers = _readers(tree, table) if table else (frozenset(), frozenset())
        return ParamTwin(twin, new_id, row_id, table, rows_of | {(classes, base)}, readers - {(classes, base)})
    return None


_UNREADABLE = object()


def _value(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNREADABLE


def _row_id(values: list[object], names: list[str], index: int) -> str | None:
    """The row's id as pytest joins it; None where a value is not a literal (an id this module cannot know)."""
    if any(v is _UNREADABLE for v in values):
        return None
    return "-".join(value_id(v, name, index) for v, name in zip(values, names))
