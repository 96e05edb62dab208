"""Twin tests: a copy of a test with one expected literal changed (else one statement's truth flipped), which a
correct fix must fail.

    twin = twin_source(source, ("TestSlug",), "test_strip_dashes", random.SystemRandom())   # None: no twin
    literals(source, (), "test_slugify_punctuation")                                       # the candidates
    flips(source, ("TestFlags",), "test_is_valid")                                         # the weaker ones

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
Boolean twins, for a test with no qualifying literal and not one row of a parametrized function: one statement
whose truth is flipped. The statement is at the same place as a literal's (the top level of the body or a
`subTest` block, before anything that can return or yield) and is one of
* `assert <expr>` (with or without a message) → `assert not <expr>`, parenthesised only where `not` would bind
  otherwise; `assert not <expr>` → `assert <expr>`; `assert a is b` ↔ `assert a is not b`, `assert a in b` ↔
  `assert a not in b`. Not an `<expr>` that reads no name (a constant holds or fails whatever the code does) and
  not any other comparison: an equality is the literal twins' and envs/expected.py's, and for `<`, `==` or `!=`
  the opposite operator is no negation Python guarantees (`a >= b` is not `not a < b` for sets), while
  `not a < b` is a form no test is written in (a twin must read like a test);
* `self.assertTrue` ↔ `assertFalse`, `assertIsNone` ↔ `assertIsNotNone`, `assertIn` ↔ `assertNotIn`,
  `assertIs` ↔ `assertIsNot`, `assertIsInstance` ↔ `assertNotIsInstance`: unittest defines each as the other's
  exact negation;
* or such a statement at the top level of the body of a top-level `for` loop over a non-empty list or tuple
  written in the loop (`for args in [(7.0,), (5.0, 7.0)]:`), whose body cannot leave an iteration early: its first
  iteration runs the statement.
If the real test passes, that statement ran and held; the flipped one evaluates the same expression in the same
state, once, and asserts the opposite truth, so a correct fix fails it. The rewrite stays on the statement's own
lines (only the length of a line changes), so every line number the report or a traceback shows is the same.

Why a literal comes first, whenever a test has one that can change: a forger inside the twin's interpreter sees only the file it
is given and must decide from it alone whether to pass. Against a changed literal that means judging which of many
plausible values is right, which is solving the test. Against a flipped statement it is one bit, and the bit has a
prior: most tests assert that something holds, not that it does not (and a message or a test name may say which).
Code that forges a boolean-twinned test only where it is asserted to hold passes every positive test's real run and
fails its twin, as a correct fix does; it is caught only in the twin run of a negative test (which then reads as
positive), so it earns credit on a task whose boolean tests all assert truth. A coin, an exit status chosen by the
code, a patched runner or report are caught as by any twin. So a boolean twin stops forgery that does not read the
assertion, not a forger who reads it and bets on the prior; docs/integrity.md lists it among the limits.
A row of a parametrized function gets no boolean twin: the function's body is every row's, and the grader takes
the other rows' statuses from the twin run. A test with no qualifying literal or statement has no twin (the suite
verdict counts those: `components["untwinned"]`).
"""

from __future__ import annotations

import ast
import random
import re
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
        todo += _runs_here(node)
    return False


def _runs_here(node: ast.AST) -> list[ast.AST]:
    """The children of `node` that run in the function `node` is in: for a definition (`def`, `class`, `lambda`,
    the statement itself too: `def gen(): yield 0` in a test's body makes `gen` a generator, not the test), its
    decorators, defaults and bases, not its body (a class body cannot return, yield or break: a syntax error)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        body = node.body if isinstance(node.body, list) else [node.body]
        return [c for c in ast.iter_child_nodes(node) if all(c is not b for b in body)]
    return list(ast.iter_child_nodes(node))


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


@dataclass(frozen=True)
class Flip:
    """One statement of a test with its truth flipped: byte spans of the UTF-8 source and what replaces each."""

    edits: tuple[tuple[int, int, str], ...]

    def apply(self, raw: bytes) -> bytes:
        for start, end, text in sorted(self.edits, reverse=True):
            raw = raw[:start] + text.encode("utf-8", errors="surrogatepass") + raw[end:]
        return raw


_FLIPPED_METHODS = {a: b for x, y in [("assertTrue", "assertFalse"), ("assertIsNone", "assertIsNotNone"),
                                      ("assertIn", "assertNotIn"), ("assertIs", "assertIsNot"),
                                      ("assertIsInstance", "assertNotIsInstance")] for a, b in ((x, y), (y, x))}
_FLIPPED_OPS: dict[type, tuple[type, str]] = {ast.Is: (ast.IsNot, "is not"), ast.IsNot: (ast.Is, "is"),
                                              ast.In: (ast.NotIn, "not in"), ast.NotIn: (ast.In, "in")}
_OPERATOR = {ast.Is: rb"\bis\b", ast.IsNot: rb"\bis\s+not\b", ast.In: rb"\bin\b", ast.NotIn: rb"\bnot\s+in\b"}


def flips(source: str, classes: tuple[str, ...], name: str) -> list[Flip]:
    """The statements of test `classes...name` in `source` whose truth a boolean twin may flip (module doc)."""
    if "[" in name:
        return []  # one row of a parametrized function: the body is every row's
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    func = function_def(tree, classes, name)
    if func is None:
        return []
    raw = source.encode("utf-8", errors="surrogatepass")
    starts = line_offsets(raw)
    out = []
    for stmt in _flat(func.body):
        inner = list(_flat(stmt.body)) if isinstance(stmt, ast.For) and _runs_once(stmt) else [stmt]
        out += [flip for s in inner if (flip := _flip(s, raw, starts)) is not None]
        if may_leave(stmt):
            break
    return out


def _runs_once(loop: ast.For) -> bool:
    """Does the loop's body run whole at least once: an iterable written as a non-empty list or tuple (no `*`
    element, which may be empty) and a body that cannot leave an iteration early? Its first iteration then runs
    each statement at the top level of the body (or of a `subTest` block in it)."""
    rows = loop.iter
    return (isinstance(rows, (ast.List, ast.Tuple)) and bool(rows.elts)
            and not any(isinstance(e, ast.Starred) for e in rows.elts)
            and not any(may_leave(s, loop=True) for s in loop.body))


def _offset(starts: list[int], line: int | None, col: int | None) -> int:
    assert line is not None and col is not None
    return starts[line] + col


def _flip(stmt: ast.stmt, raw: bytes, starts: list[int]) -> Flip | None:
    """The flip of one statement, checked by parsing the rewritten statement: it must be the statement with only its
    truth negated (a rewrite that a comment, a line continuation or an odd spacing would make mean anything else is
    dropped)."""
    edits: tuple[tuple[int, int, str], ...]
    if isinstance(stmt, ast.Assert):
        test = stmt.test
        if not any(isinstance(n, ast.Name) for n in ast.walk(test)):
            return None  # a constant, or a value that reads nothing: it holds or fails whatever the code does
        a, b = _offset(starts, test.lineno, test.col_offset), _offset(starts, test.end_lineno, test.end_col_offset)
        new: ast.expr
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            word = re.match(rb"not\s*", raw[a:b])
            if word is None:
                return None
            new, edits = test.operand, ((a, a + word.end(), ""),)
        elif isinstance(test, ast.Compare):
            op = type(test.ops[0])
            if len(test.ops) != 1 or op not in _FLIPPED_OPS:
                return None
            gap = _offset(starts, test.left.end_lineno, test.left.end_col_offset)
            found = re.search(_OPERATOR[op], raw[gap:_offset(starts, test.comparators[0].lineno,
                                                           test.comparators[0].col_offset)])
            if found is None:
                return None
            flipped, text = _FLIPPED_OPS[op]
            new = ast.Compare(left=test.left, ops=[flipped()], comparators=test.comparators)
            edits = ((gap + found.start(), gap + found.end(), text),)
        else:
            new = ast.UnaryOp(op=ast.Not(), operand=test)
            edits = ((a, a, "not "),)
            if not _rewrites_to(stmt, raw, starts, Flip(edits), ast.Assert(test=new, msg=stmt.msg)):
                edits = ((a, a, "not ("), (b, b, ")"))
        want: ast.stmt = ast.Assert(test=new, msg=stmt.msg)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call, func = stmt.value, stmt.value.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
                and func.attr in _FLIPPED_METHODS and (call.args or call.keywords)):
            return None
        end = _offset(starts, func.end_lineno, func.end_col_offset)
        edits = ((end - len(func.attr), end, _FLIPPED_METHODS[func.attr]),)
        want = ast.Expr(ast.Call(func=ast.Attribute(value=func.value, attr=_FLIPPED_METHODS[func.attr], ctx=func.ctx),
                                 args=call.args, keywords=call.keywords))
    else:
        return None
    flip = Flip(edits)
    return flip if _rewrites_to(stmt, raw, starts, flip, want) else None


def _rewrites_to(stmt: ast.stmt, raw: bytes, starts: list[int], flip: Flip, want: ast.stmt) -> bool:
    """Does `flip` turn `stmt` (its own text, parsed alone) into `want`, on the same number of lines?"""
    a, b = _offset(starts, stmt.lineno, stmt.col_offset), _offset(starts, stmt.end_lineno, stmt.end_col_offset)
    inner = Flip(tuple((s - a, e - a, t) for s, e, t in flip.edits))
    text = inner.apply(raw[a:b])
    try:
        body = ast.parse(text.decode("utf-8", errors="surrogatepass")).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return (len(body) == 1 and ast.dump(body[0]) == ast.dump(want)
            and text.count(b"\n") == raw[a:b].count(b"\n"))


def literal_twin(source: str, classes: tuple[str, ...], name: str, rng: random.Random) -> str | None:
    """`source` with one expected literal of the test changed (chosen by `rng`), or None when none can change
    (there is none, or only ones like `""` and `[]`, with no letter or digit)."""
    candidates = literals(source, classes, name)
    rng.shuffle(candidates)
    raw = source.encode("utf-8", errors="surrogatepass")
    for lit in candidates:
        new = changed(lit.text, rng)
        if new is not None:
            return (raw[:lit.start] + new.encode("utf-8", errors="surrogatepass") + raw[lit.end:]).decode(
                "utf-8", errors="surrogatepass")
    return None


def choose_twin(source: str, classes: tuple[str, ...], name: str, rng: random.Random) -> tuple[str, bool] | None:
    """(`literal_twin`, False), or, where the test has none, (`source` with one statement's truth flipped
    (`flips`, chosen by `rng`), True); None when it has neither. The flag says the twin is the weaker kind."""
    twin = literal_twin(source, classes, name, rng)
    if twin is not None:
        return twin, False
    options = flips(source, classes, name)
    if not options:
        return None
    raw = source.encode("utf-8", errors="surrogatepass")
    return rng.choice(options).apply(raw).decode("utf-8", errors="surrogatepass"), True


def twin_source(source: str, classes: tuple[str, ...], name: str, rng: random.Random) -> str | None:
    """The twin `choose_twin` writes, without its kind."""
    chosen = choose_twin(source, classes, name, rng)
    return None if chosen is None else chosen[0]
