"""Instantiating a template and injecting one bug as an AST mutation.

    src = instantiate(template, rng)               # names and constants randomised, layout normalised
    mutant = mutate(ast.parse(src), "operator", 0, rng)

Kinds (MUTATIONS): operator swap, off-by-one (comparison boundary, `range` bound, index), wrong constant,
swapped arguments/operands, missing branch. `mutation_sites(tree)` lists where each kind applies.
"""

from __future__ import annotations

import ast
import copy
import random
from typing import Any

from flywheel.tasks.synth.templates import (
    ACC_NAMES,
    ELEM_NAMES,
    LIST_NAMES,
    LOOP_NAMES,
    NUM_NAMES,
    STR_NAMES,
    Template,
)


def instantiate(t: Template, r: random.Random) -> tuple[str, str]:
    """(function name, normalised source) with randomised names and constants."""
    used: set[str] = set()

    def pick(pool: list[str]) -> str:
        name = r.choice([p for p in pool if p not in used])
        used.add(name)
        return name

    fill: dict[str, Any] = {"f": r.choice(t.names)}
    for key, pool in (("x", NUM_NAMES), ("y", NUM_NAMES), ("z", NUM_NAMES), ("xs", LIST_NAMES), ("ys", LIST_NAMES),
                      ("s", STR_NAMES), ("i", LOOP_NAMES), ("e", ELEM_NAMES), ("acc", ACC_NAMES), ("out", ACC_NAMES)):
        fill[key] = pick(pool)
    fill["ch"] = r.choice("aeiou")
    for key, lo, hi in t.consts:
        fill[key] = r.randint(lo, hi)
    src = ast.unparse(ast.parse(t.src.format(**fill))) + "\n"
    return fill["f"], src


def mutation_sites(tree: ast.AST) -> list[tuple[str, int]]:
    """Every (mutation kind, node ordinal in ast.walk order) that applies to `tree`."""
    out: list[tuple[str, int]] = []
    for idx, node in enumerate(ast.walk(tree)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BIN_SWAP:
            out.append(("operator", idx))
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.FloorDiv, ast.Mod)):
            out.append(("swap_args", idx))
        if isinstance(node, ast.BoolOp):
            out.append(("operator", idx))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            if type(node.ops[0]) in _CMP_SWAP:
                out.append(("operator", idx))
            if type(node.ops[0]) in _CMP_BOUNDARY:
                out.append(("off_by_one", idx))
            out.append(("swap_args", idx))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "range" and node.args:
                out.append(("off_by_one", idx))
            if len(node.args) >= 2 and ast.dump(node.args[0]) != ast.dump(node.args[1]):
                out.append(("swap_args", idx))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Constant, ast.Slice, ast.UnaryOp)):
            out.append(("off_by_one", idx))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(("constant", idx))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) == 1:
            out.append(("constant", idx))
        if isinstance(node, ast.If):
            out.append(("missing_branch", idx))
    return out


_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv}
_CMP_SWAP = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
             ast.In: ast.NotIn, ast.NotIn: ast.In}
_CMP_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


def _bump(expr: ast.expr, r: random.Random) -> ast.expr:
    """`expr` shifted by one: `n + 1` -> `n`, `3` -> `2`/`4`, else `expr - 1` or `expr + 1`."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and isinstance(expr.right, ast.Constant) \
            and expr.right.value == 1:
        return expr.left
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return ast.Constant(expr.value + r.choice((-1, 1)))
    return ast.BinOp(expr, r.choice((ast.Sub(), ast.Add())), ast.Constant(1))


def mutate(tree: ast.Module, kind: str, ordinal: int, r: random.Random) -> ast.Module:
    tree = copy.deepcopy(tree)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    node: Any = list(ast.walk(tree))[ordinal]  # `kind` fixes its node class (the sites finder chose it)
    if kind == "operator":
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            node.op = _BIN_SWAP[type(node.op)]()
        elif isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        else:
            node.ops = [_CMP_SWAP[type(node.ops[0])]()]
    elif kind == "off_by_one":
        if isinstance(node, ast.Compare):
            node.ops = [_CMP_BOUNDARY[type(node.ops[0])]()]
        elif isinstance(node, ast.Call):
            node.args[-1] = _bump(node.args[-1], r)
        elif isinstance(node.slice, ast.Slice):
            sl = node.slice
            bounds = [b for b in ("lower", "upper") if getattr(sl, b) is not None]
            if not bounds:
                sl.upper = ast.UnaryOp(ast.USub(), ast.Constant(1))
            else:
                b = r.choice(bounds)
                setattr(sl, b, _bump(getattr(sl, b), r))
        else:
            node.slice = _bump(node.slice, r)
    elif kind == "constant":
        if isinstance(node.value, str):
            node.value = r.choice([c for c in "aeiouxyz-" if c != node.value])
        else:
            node.value = r.choice([node.value + r.randint(1, 3), node.value - r.randint(1, 3), node.value * 2 + 1])
    elif kind == "swap_args":
        if isinstance(node, ast.BinOp):
            node.left, node.right = node.right, node.left
        elif isinstance(node, ast.Compare):
            node.left, node.comparators = node.comparators[0], [node.left]
        else:
            node.args[0], node.args[1] = node.args[1], node.args[0]
    elif kind == "missing_branch":
        parent = parents[id(node)]
        for field in ("body", "orelse"):
            body = getattr(parent, field, None)
            if isinstance(body, list) and any(s is node for s in body):
                pos = next(k for k, s in enumerate(body) if s is node)
                if node.orelse:
                    body[pos:pos + 1] = node.orelse  # the first branch vanishes
                elif len(body) > 1:
                    del body[pos]  # the whole `if` vanishes
                else:
                    body[pos:pos + 1] = node.body  # the guard vanishes
                break
    ast.fix_missing_locations(tree)
    return tree
