"""Twin tests: a copy of a test with one expected literal changed, which a correct fix must fail.

    twin = twin_source(source, ("TestSlug",), "test_strip_dashes", random.SystemRandom())   # None: no twin
    literals(source, (), "test_slugify_punctuation")                                       # the candidates

Why: the suite verdict (envs/suite.py) runs each FAIL_TO_PASS test in its own interpreter, and the only thing the
grader takes from that process is whether it exited 0. Code under test can choose its exit status, patch the
runner, rewrite the report or return an object equal to anything. It cannot do any of that for the real test and
not for its twin without telling them apart, and the twin differs from the real test only in one expected value,
chosen at grading time: telling them apart means knowing the right answer. So a run whose twin passes is forged.

Which literals qualify, so that a correct fix always fails the twin:
* the expected side of `assert <expr> == <literal>` (either side) or of `self.assertEqual(a, b)`, or the literal
  of a top-level `name = <literal>` when that side is `name` and the test uses the name nowhere else (one
  assignment, one comparison: changing it changes only what the test expects);
* in a statement at the top level of the test function's body, before any statement that can `return` or
  `yield`: if the real test passes, that statement ran, so the compared value equalled the original literal and
  so differs from the changed one (builtin equality; an operand with a tolerant `__eq__`, such as
  `pytest.approx(x) == 0.5`, still fails: the change is larger than any tolerance it uses);
* a literal that `ast.literal_eval` reads: numbers, strings, bytes, booleans, and containers of them;
* a statement inside `with self.subTest(...)` counts as one at the top level (a failure there is recorded, the test
  goes on and then fails);
* a loop table (`for args, expected in [((1, 6), 3), ...]:` at the top level, over a literal list or tuple, whose
  body cannot leave an iteration early): the `expected` of any row that is a literal without floats, when the
  body's first equality compares that loop name, read nowhere before and assigned nowhere in the body, with
  something it is absent from. Every row runs, so a correct fix fails the changed one.

How a literal changes: one letter or digit of its source text becomes another of the same kind (lower, upper,
digit; never only the case, and a digit by at least 2, so an off-by-one answer is not the twin's), so the
quoting, spacing and length of the file stay the same and the new value is as plausible as the old one. `True`
and `False` swap. Characters after a backslash (escapes) are never touched.
A test with no qualifying literal has no twin (the suite verdict counts those: `components["untwinned"]`).
"""

from __future__ import annotations

import ast
import random
import string
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

_ASSERT_EQUAL = {"assertEqual", "assertEquals"}
_KINDS = (string.ascii_lowercase, string.ascii_uppercase, string.digits)
_TYPES = (int, float, complex, str, bytes, bool, tuple, list, dict, set, frozenset)


@dataclass(frozen=True)
class Literal:
    start: int  # byte offsets into the UTF-8 source
    end: int
    text: str


def function_def(tree: ast.Module, classes: tuple[str, ...], name: str) -> ast.FunctionDef | None:
    body: list[ast.stmt] = tree.body
    for cls in classes:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            return None
        body = found[-1].body  # the last definition is the one Python binds
    funcs = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    return funcs[-1] if funcs else None  # type: ignore[return-value]


def may_leave(stmt: ast.stmt, loop: bool = False) -> bool:
    """Can the statement end the function early (a return or yield anywhere in it, nested functions aside)? With
    `loop`, also a loop's iteration (a break or continue anywhere in it)."""
    kinds: tuple[type, ...] = (ast.Return, ast.Yield, ast.YieldFrom) + ((ast.Break, ast.Continue) if loop else ())
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, kinds):
            return True
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(child)
    return False


def _is_literal(node: ast.expr) -> bool:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return type(value) in _TYPES


def compared(stmt: ast.stmt) -> list[ast.expr]:
    """The two sides of a top-level `assert a == b` or `self.assertEqual(a, b)`, else []."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare):
        cmp = stmt.test
        if len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq):
            return [cmp.left, cmp.comparators[0]]
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr in _ASSERT_EQUAL and len(call.args) >= 2:
            return list(call.args[:2])
    return []


def _expected_sides(stmt: ast.stmt, bound: dict[str, ast.expr], uses: dict[str, int]) -> list[ast.expr]:
    """The literal to change for one statement: a literal side of its equality, or the literal a side's name was
    bound to (`expected = 600` ... `assert area(20, 30) == expected`) when that name is used nowhere else in the
    test (so changing it changes only what the test expects)."""
    sides = compared(stmt)
    direct = [side for side in sides if _is_literal(side)]
    if direct:
        return direct[:1]
    named = [bound[side.id] for side in sides if isinstance(side, ast.Name) and side.id in bound
             and uses.get(side.id) == 2]
    return named[:1]


def _bound_literal(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """(name, literal) of a top-level `name = <literal>`."""
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and _is_literal(stmt.value)):
        return stmt.targets[0].id, stmt.value
    return None


def _subtest(stmt: ast.stmt) -> bool:
    """`with self.subTest(...):`: a failure inside is recorded and the test goes on, and the test then fails."""
    return isinstance(stmt, ast.With) and bool(stmt.items) and all(
        isinstance(i.context_expr, ast.Call) and isinstance(i.context_expr.func, ast.Attribute)
        and i.context_expr.func.attr == "subTest" and i.optional_vars is None for i in stmt.items)


def _flat(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of `body` with the bodies of its `subTest` blocks in their place."""
    for stmt in body:
        if isinstance(stmt, ast.With) and _subtest(stmt):
            yield from _flat(stmt.body)
        else:
            yield stmt


def reads(node: ast.AST, name: str) -> bool:
    """Does `node` read or bind the name anywhere in it?"""
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def compared_name(stmts: Iterable[ast.stmt], names: Collection[str], stored: set[str]) -> str | None:
    """The first of `names` that is one side of a top-level equality in `stmts` (`compared`), not in `stored`, read
    by no statement before it and absent from the other side; None when none is, or a statement that may leave
    the function comes first. Changing that name's value changes only what the comparison expects."""
    read: set[str] = set()
    for stmt in stmts:
        sides = compared(stmt)
        for i, side in enumerate(sides):
            if (isinstance(side, ast.Name) and side.id in names and side.id not in stored | read
                    and not reads(sides[1 - i], side.id)):
                return side.id
        read |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        if may_leave(stmt):
            break
    return None


def _loop_rows(loop: ast.For) -> list[ast.expr]:
    """The expected values of a loop table: `for args, expected in [(..., 3), ...]:` whose body compares `expected`
    (one side of its first top-level equality, possibly in a `subTest` block, read nowhere before it, assigned
    nowhere in the body, absent from the other side), in rows that are literals without floats. Every row runs
    (the body cannot leave an iteration early), so a correct fix fails the row whose value changed."""
    target, rows = loop.target, loop.iter
    if not isinstance(rows, (ast.List, ast.Tuple)) or not rows.elts or loop.orelse \
            or any(may_leave(s, loop=True) for s in loop.body):
        return []
    if isinstance(target, ast.Name):
        names = [target.id]
    elif isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        names = [e.id for e in target.elts]  # type: ignore[attr-defined]
    else:
        return []
    stored = {n.id for s in loop.body for n in ast.walk(s) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    param = compared_name(_flat(loop.body), names, stored)
    if param is None:
        return []
    out = []
    for row in rows.elts:
        if len(names) == 1:
            value = row
        elif isinstance(row, (ast.Tuple, ast.List)) and len(row.elts) == len(names):
            value = row.elts[names.index(param)]
        else:
            return []  # a row that does not unpack as the target: not a table this module reads
        if _is_literal(value) and not any(isinstance(n, ast.Constant) and isinstance(n.value, (float, complex))
                                          for n in ast.walk(value)):
            out.append(value)
    return out


def line_offsets(source: bytes) -> list[int]:
    """Byte offset of the start of each line (1-based line numbers index it from 1), as `ast` counts lines."""
    out, pos = [0, 0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line)
        out.append(pos)
    return out


def literals(source: str, classes: tuple[str, ...], name: str) -> list[Literal]:
    """The expected literals of test `classes...name` in `source` that a twin may change (see the module doc)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    func = function_def(tree, classes, name.split("[", 1)[0])
    if func is None:
        return []
    raw = source.encode("utf-8", errors="surrogatepass")
    starts = line_offsets(raw)
    uses: dict[str, int] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            uses[node.id] = uses.get(node.id, 0) + 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for n in node.names:
                uses[n] = uses.get(n, 0) + 99  # bound outside the test: never a test's own expected value
    bound: dict[str, ast.expr] = {}
    out = []
    for stmt in _flat(func.body):
        pair = _bound_literal(stmt)
        if pair is not None:
            bound[pair[0]] = pair[1]
        nodes = _loop_rows(stmt) if isinstance(stmt, ast.For) else _expected_sides(stmt, bound, uses)
        for node in nodes:
            if node.end_lineno is None or node.end_col_offset is None:
                continue
            a = starts[node.lineno] + node.col_offset
            b = starts[node.end_lineno] + node.end_col_offset
            out.append(Literal(a, b, raw[a:b].decode("utf-8", errors="surrogatepass")))
        if may_leave(stmt):
            break
    return out


def changed(text: str, rng: random.Random) -> str | None:
    """`text` (a literal's source) with one letter or digit replaced so that its value differs; None if none can."""
    value = ast.literal_eval(text)
    if text in ("True", "False"):
        return "False" if text == "True" else "True"
    positions = [i for i, c in enumerate(text) if c.isascii() and c.isalnum() and (i == 0 or text[i - 1] != "\\")]
    rng.shuffle(positions)
    for i in positions:
        kind = next(k for k in _KINDS if text[i] in k)
        far = [c for c in kind if abs(ord(c) - ord(text[i])) > (1 if kind is string.digits else 0)]
        new = text[:i] + rng.choice(far) + text[i + 1:]
        try:
            new_value = ast.literal_eval(new)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if type(new_value) is type(value) and new_value != value:
            return new
    return None


def twin_source(source: str, classes: tuple[str, ...], name: str, rng: random.Random) -> str | None:
    """`source` with one expected literal of the test changed (chosen by `rng`), or None when it has none."""
    candidates = literals(source, classes, name)
    rng.shuffle(candidates)
    raw = source.encode("utf-8", errors="surrogatepass")
    for lit in candidates:
        new = changed(lit.text, rng)
        if new is not None:
            return (raw[:lit.start] + new.encode("utf-8", errors="surrogatepass") + raw[lit.end:]).decode(
                "utf-8", errors="surrogatepass")
    return None
