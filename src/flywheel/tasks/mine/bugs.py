"""Bugs injected into real functions: AST mutations spliced into the original text, and blanked bodies.

    for bug in candidate_bugs("toolz/itertoolz.py", text, random.Random(0)):
        bug.kind, bug.function, bug.new_text          # the whole file with the bug in it

Why splice instead of `ast.unparse` of the file: the bugged file must differ from the original only where the bug
is, or the diff an agent sees (and the reference fix) would reformat the whole module. A mutation (the synthetic
generator's kinds, tasks/synth/mutations.py: operator, off-by-one, constant, swapped arguments) changes one
expression; its source span is replaced by the unparsed mutant (parenthesised only when the tree would otherwise
differ), and the result is re-parsed and compared with the mutated tree, so a splice that would mean something else
is dropped. `blank_body` keeps a function's signature and docstring and replaces the rest by
`raise NotImplementedError` (SWE-smith's "remove the body" strategy: the tests say what to write back).
Only functions of at least `MIN_BODY_LINES` lines in non-test modules are used.
"""

from __future__ import annotations

import ast
import random
import textwrap
from dataclasses import dataclass
from typing import Any

from flywheel.tasks.loaders import is_test_path
from flywheel.tasks.synth.mutations import mutate, mutation_sites

KINDS = ("operator", "off_by_one", "constant", "swap_args", "blank_body")
MIN_BODY_LINES = 2


@dataclass
class Bug:
    path: str
    function: str  # qualified name, e.g. `Inflector.camelize`
    kind: str
    line: int  # 1-based line of the change in the original
    old_text: str
    new_text: str


def functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of every function and method, nested classes included."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + node.name, node))
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")

    visit(tree.body, "")
    return out


def is_source_module(path: str) -> bool:
    """A module of the library itself: Python, not a test, not packaging or docs."""
    parts = path.split("/")
    return (path.endswith(".py") and not is_test_path(path) and parts[-1] not in ("setup.py", "conftest.py")
            and not any(p in ("tests", "test", "testing", "docs", "doc", "examples", "benchmarks") for p in parts[:-1]))


def _offsets(text: str) -> list[int]:
    out, pos = [0], 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        out.append(pos)
    return out


def _splice(text: str, offs: list[int], node: Any, replacement: str) -> str:
    start = offs[node.lineno - 1] + len(text[offs[node.lineno - 1]:].encode()[:node.col_offset].decode(errors="ignore"))
    end_line = offs[node.end_lineno - 1]
    end = end_line + len(text[end_line:].encode()[:node.end_col_offset].decode(errors="ignore"))
    return text[:start] + replacement + text[end:]


def _same_function(text: str, fn: Any, expected: ast.AST) -> bool:
    """The lines of `fn` in `text` (a splice never moves them) parse to `expected`: only the function is re-parsed,
    dedented, so a 4,000-line module costs what its function costs."""
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    segment = "".join(text.splitlines(keepends=True)[first - 1:fn.end_lineno])
    try:
        tree = ast.parse(textwrap.dedent(segment))
    except SyntaxError:
        return False
    return len(tree.body) == 1 and ast.dump(tree.body[0]) == ast.dump(expected)


def _mutations(path: str, text: str, offs: list[int], index: int, qual: str, fn: ast.AST, r: random.Random,
               limit: int) -> list[Bug]:
    """Up to `limit` mutations of the function `fn` (the `index`-th of its module), tried in a random order.
    Each is made on a copy of the function alone (a module's deep copy per site made large modules slow)."""
    mini = ast.Module(body=[fn], type_ignores=[])  # type: ignore[list-item]
    walk: list[Any] = list(ast.walk(mini))
    sites = [(k, o) for k, o in mutation_sites(mini) if k != "missing_branch" and o > 1]
    r.shuffle(sites)
    out: list[Bug] = []
    for kind, ordinal in sites:
        if len(out) >= limit:
            break
        node = walk[ordinal]
        if getattr(node, "lineno", None) is None or node.lineno != node.end_lineno:
            continue  # single-line expressions only: the splice stays one line
        mutant = mutate(mini, kind, ordinal, r)
        new_node: Any = list(ast.walk(mutant))[ordinal]
        src = ast.unparse(new_node)
        for candidate in (src, f"({src})"):
            new_text = _splice(text, offs, node, candidate)
            if new_text != text and _same_function(new_text, fn, mutant.body[0]):
                out.append(Bug(path, qual, kind, node.lineno, text, new_text))
                break
    return out


def _blank(path: str, text: str, qual: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Bug | None:
    body = fn.body
    doc = 1 if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str) else 0  # type: ignore[attr-defined]
    rest = body[doc:]
    if not rest or rest[0].lineno == fn.lineno:
        return None  # a one-line `def f(): return x`: nothing to blank cleanly
    lines = text.splitlines(keepends=True)
    first, last = rest[0].lineno, rest[-1].end_lineno or rest[-1].lineno
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    new_text = "".join(lines[:first - 1]) + f"{indent}raise NotImplementedError\n" + "".join(lines[last:])
    top = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    try:  # the function alone, dedented: re-parsing a large module per function was most of the cost
        ast.parse(textwrap.dedent("".join(lines[top - 1:first - 1]) + f"{indent}raise NotImplementedError\n"))
    except SyntaxError:
        return None
    return Bug(path, qual, "blank_body", first, text, new_text)


def candidate_bugs(path: str, text: str, r: random.Random, *, per_function: int = 2) -> list[Bug]:
    """Up to `per_function` mutations and one blanked body per function of the module at `path`, shuffled."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out: list[Bug] = []
    offs = _offsets(text)
    for index, (qual, fn) in enumerate(functions(tree)):
        if (fn.end_lineno or fn.lineno) - fn.lineno < MIN_BODY_LINES:
            continue
        out += _mutations(path, text, offs, index, qual, fn, r, per_function)
        blank = _blank(path, text, qual, fn)
        if blank is not None:
            out.append(blank)
    r.shuffle(out)
    return out
