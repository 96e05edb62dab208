"""Synthetic bug-fix tasks: a seeded generator of tiny Python modules with tests and one injected bug.

    flywheel tasks synth --n 1000 --seed 0 --out tasks.jsonl [--split heldout] [--difficulty easy]
    tasks = generate_tasks(50, seed=0, split="train", difficulty="easy")

Why it looks like this:
* A task is one small module (`calc.py`: one function of 3-10 lines; two functions at `hard`), a visible
  test file and a hidden one. The module comes from one of ~40 *templates* with randomised function,
  variable and module names and constants; `ast.unparse` normalises the layout of the original and the
  mutant alike, so the diff between them is exactly the bug.
* Bugs are AST mutations: operator swap, off-by-one (comparison boundary, `range` bound, index),
  wrong constant, swapped arguments/operands, missing branch (an `if` deleted or its guard dropped).
* Difficulty is how much the statement gives away. `easy`: the file and the exact old and new line (a
  tiny model can solve it by copying from the statement into `str_replace`); `medium`: the file, the
  function and a failing call; `hard`: only a failing call, and the module holds a second function.
* Splits are by template: held-out templates (every fourth) never appear in train, so held-out pass@1
  measures generalisation to functions the policy has never seen, not memorisation.
* Verification is in-process: the module and its test files are exec'd in a private module namespace and
  the `test_*` functions called directly (~1 ms per task), instead of one pytest subprocess per task
  (~0.5 s each, minutes for 1000). A task is kept only if the original passes every test and the mutant
  fails at least one. Templates have no `while` loops or recursion, so no mutant can hang the generator.
* Tests run under `runtests.py` (`envs/minitest.py`, shipped with each task and restored at grading),
  a pytest-compatible runner that starts in ~20 ms instead of pytest's ~450 ms; every session is graded
  and the agent runs the tests too, so this is most of a rollout's CPU. `runner="pytest"` (config
  `synth.test_runner`) keeps plain pytest; both grade identically (tests/unit/test_minitest.py).

`oracle_actions(task)` replays the known fix through the tools (view, str_replace, submit); it is used by
tests and to write mid-training transcripts.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import random
import re
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flywheel.envs.tasks import RUNNER_FILE, runner_source
from flywheel.types import Task, ToolCall

Split = Literal["train", "heldout"]
DIFFICULTIES = ("easy", "medium", "hard")
MUTATIONS = ("operator", "off_by_one", "constant", "swap_args", "missing_branch")
NUM_VISIBLE_CASES = 2
NUM_HIDDEN_CASES = 6

NUM_NAMES = ["a", "b", "x", "y", "n", "m", "p", "q", "u", "v", "w", "z"]
LIST_NAMES = ["xs", "items", "nums", "vals", "data", "seq", "arr", "ys"]
STR_NAMES = ["s", "text", "word", "line", "name"]
LOOP_NAMES = ["i", "j", "k", "idx"]
ACC_NAMES = ["total", "acc", "res", "out", "result", "count"]
ELEM_NAMES = ["e", "it", "el", "item", "c"]
MODULE_NAMES = ["calc", "mathops", "numkit", "listops", "seqtools", "strops", "textkit", "helpers", "funcs",
                "logic", "compute", "arith", "mini", "kit", "lib", "core", "utils", "ops", "basics", "algo"]


@dataclass(frozen=True)
class Template:
    """One function family. `src` uses {f} for the name, {x}/{y}/{z} numbers, {xs}/{ys} lists, {s} a
    string, {i} a loop index, {e} an element, {acc}/{out} accumulators and {k1}/{k2}/{ch} constants."""

    id: str
    names: tuple[str, ...]
    src: str
    args: Callable[[random.Random], tuple]
    consts: tuple[tuple[str, int, int], ...] = ()


def _ints(r: random.Random, lo: int = -9, hi: int = 9, min_len: int = 1, max_len: int = 6) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(min_len, max_len))]


def _word(r: random.Random, min_len: int = 1, max_len: int = 7) -> str:
    return "".join(r.choice("abcdeiou") for _ in range(r.randint(min_len, max_len)))


_I = random.Random.randint
TEMPLATES: list[Template] = [
    Template("clamp", ("clamp", "bound"), "def {f}({x}, {y}, {z}):\n    if {x} < {y}:\n        return {y}\n"
             "    if {x} > {z}:\n        return {z}\n    return {x}\n",
             lambda r: (r.randint(-20, 20), r.randint(-10, 0), r.randint(1, 10))),
    Template("sum_squares", ("sum_squares", "square_total"), "def {f}({xs}):\n    {acc} = 0\n    for {e} in {xs}:\n"
             "        {acc} += {e} * {e}\n    return {acc}\n", lambda r: (_ints(r),)),
    Template("count_above", ("count_above", "num_greater"), "def {f}({xs}, {x}):\n    {acc} = 0\n"
             "    for {e} in {xs}:\n        if {e} > {x}:\n            {acc} += 1\n    return {acc}\n",
             lambda r: (_ints(r), r.randint(-3, 3))),
    Template("linear", ("linear", "affine"), "def {f}({x}):\n    return {x} * {k1} + {k2}\n",
             lambda r: (r.randint(-10, 10),), (("k1", 2, 9), ("k2", 2, 20))),
    Template("triangular", ("triangular", "sum_to"), "def {f}({x}):\n    {acc} = 0\n"
             "    for {i} in range(1, {x} + 1):\n        {acc} += {i}\n    return {acc}\n",
             lambda r: (r.randint(0, 12),)),
    Template("list_max", ("list_max", "largest"), "def {f}({xs}):\n    {acc} = {xs}[0]\n    for {e} in {xs}[1:]:\n"
             "        if {e} > {acc}:\n            {acc} = {e}\n    return {acc}\n", lambda r: (_ints(r),)),
    Template("even_sum", ("even_sum", "sum_is_even"), "def {f}({x}, {y}):\n    return ({x} + {y}) % 2 == 0\n",
             lambda r: (r.randint(-9, 9), r.randint(-9, 9))),
    Template("abs_diff", ("abs_diff", "distance"), "def {f}({x}, {y}):\n    if {x} > {y}:\n        return {x} - {y}\n"
             "    return {y} - {x}\n", lambda r: (r.randint(-9, 9), r.randint(-9, 9))),
    Template("sign", ("sign", "signum"), "def {f}({x}):\n    if {x} > 0:\n        return 1\n    if {x} < 0:\n"
             "        return -1\n    return 0\n", lambda r: (r.randint(-5, 5),)),
    Template("count_char", ("count_char", "num_letter"), "def {f}({s}):\n    {acc} = 0\n    for {e} in {s}:\n"
             "        if {e} == '{ch}':\n            {acc} += 1\n    return {acc}\n", lambda r: (_word(r, 0, 8),)),
    Template("tail", ("tail", "last_few"), "def {f}({xs}, {x}):\n    return {xs}[len({xs}) - {x}:]\n",
             lambda r: (_ints(r, min_len=3), r.randint(1, 3))),
    Template("evens", ("evens", "keep_even"), "def {f}({xs}):\n    return [{e} for {e} in {xs} if {e} % 2 == 0]\n",
             lambda r: (_ints(r),)),
    Template("scale", ("scale", "times_all"), "def {f}({xs}):\n    return [{e} * {k1} + {k2} for {e} in {xs}]\n",
             lambda r: (_ints(r),), (("k1", 2, 7), ("k2", 1, 9))),
    Template("dot", ("dot", "inner"), "def {f}({xs}, {ys}):\n    {acc} = 0\n    for {i} in range(len({xs})):\n"
             "        {acc} += {xs}[{i}] * {ys}[{i}]\n    return {acc}\n",
             lambda r: (lambda n: (_ints(r, min_len=n, max_len=n), _ints(r, min_len=n, max_len=n)))(r.randint(2, 5))),
    Template("factorial", ("factorial", "fact"), "def {f}({x}):\n    {acc} = 1\n    for {i} in range(2, {x} + 1):\n"
             "        {acc} *= {i}\n    return {acc}\n", lambda r: (r.randint(0, 8),)),
    Template("fizz", ("fizz", "fizzbuzz"), "def {f}({x}):\n    if {x} % 15 == 0:\n        return 'fizzbuzz'\n"
             "    if {x} % 3 == 0:\n        return 'fizz'\n    if {x} % 5 == 0:\n        return 'buzz'\n"
             "    return str({x})\n", lambda r: (r.randint(1, 40),)),
    Template("level", ("level", "rank"), "def {f}({x}):\n    if {x} >= {k1}:\n        return 'high'\n"
             "    if {x} >= {k2}:\n        return 'mid'\n    return 'low'\n", lambda r: (r.randint(0, 100),),
             (("k1", 60, 90), ("k2", 20, 50))),
    Template("mean_floor", ("mean_floor", "avg_int"), "def {f}({xs}):\n    return sum({xs}) // len({xs})\n",
             lambda r: (_ints(r, 0, 20),)),
    Template("in_range", ("in_range", "between"), "def {f}({x}, {y}, {z}):\n    return {y} <= {x} and {x} < {z}\n",
             lambda r: (r.randint(-5, 12), r.randint(-3, 3), r.randint(4, 9))),
    Template("pair_sums", ("pair_sums", "adjacent_sums"), "def {f}({xs}):\n"
             "    return [{xs}[{i}] + {xs}[{i} + 1] for {i} in range(len({xs}) - 1)]\n", lambda r: (_ints(r, min_len=2),)),
    Template("capital", ("capital", "cap_first"), "def {f}({s}):\n    return {s}[:1].upper() + {s}[1:]\n",
             lambda r: (_word(r),)),
    Template("running", ("running", "prefix_sums"), "def {f}({xs}):\n    {acc} = 0\n    {out} = []\n"
             "    for {e} in {xs}:\n        {acc} += {e}\n        {out}.append({acc})\n    return {out}\n",
             lambda r: (_ints(r),)),
    Template("poly", ("poly", "quad"), "def {f}({x}):\n    return {x} * {x} - {k1} * {x} + {k2}\n",
             lambda r: (r.randint(-9, 9),), (("k1", 2, 9), ("k2", 1, 9))),
    Template("safe_div", ("safe_div", "div_or"), "def {f}({x}, {y}):\n    if {y} == 0:\n        return {k1}\n"
             "    return {x} // {y}\n", lambda r: (r.randint(-20, 20), r.randint(-3, 5)), (("k1", 1, 9),)),
    Template("index_of", ("index_of", "find_pos"), "def {f}({xs}, {x}):\n    for {i} in range(len({xs})):\n"
             "        if {xs}[{i}] == {x}:\n            return {i}\n    return -1\n",
             lambda r: (_ints(r, 0, 6, 2, 6), r.randint(0, 6))),
    Template("digit_sum", ("digit_sum", "sum_digits"), "def {f}({x}):\n    {acc} = 0\n    for {e} in str(abs({x})):\n"
             "        {acc} += int({e})\n    return {acc}\n", lambda r: (r.randint(-999, 999),)),
    Template("every_kth", ("every_kth", "stride"), "def {f}({xs}):\n    return {xs}[::{k1}]\n",
             lambda r: (_ints(r, min_len=3, max_len=8),), (("k1", 2, 3),)),
    Template("to_fahrenheit", ("to_fahrenheit", "c_to_f"), "def {f}({x}):\n    return {x} * 9 // 5 + 32\n",
             lambda r: (r.randint(-40, 100),)),
    Template("perimeter", ("perimeter", "rect_border"), "def {f}({x}, {y}):\n    return 2 * ({x} + {y})\n",
             lambda r: (r.randint(1, 20), r.randint(1, 20))),
    Template("is_triangle", ("is_triangle", "can_form_triangle"), "def {f}({x}, {y}, {z}):\n"
             "    return {x} + {y} > {z} and {x} + {z} > {y} and {y} + {z} > {x}\n",
             lambda r: (r.randint(1, 9), r.randint(1, 9), r.randint(1, 9))),
    Template("leap", ("leap", "is_leap"), "def {f}({x}):\n    return {x} % 4 == 0 and ({x} % 100 != 0 or {x} % 400 == 0)\n",
             lambda r: (r.choice([r.randint(1800, 2100), 4 * r.randint(450, 520), 100 * r.randint(15, 25)]),)),
    Template("median3", ("median3", "middle"), "def {f}({x}, {y}, {z}):\n    return sorted([{x}, {y}, {z}])[1]\n",
             lambda r: (r.randint(-9, 9), r.randint(-9, 9), r.randint(-9, 9))),
    Template("wrap", ("wrap", "cyclic"), "def {f}({x}, {y}):\n    return ({x} + {y}) % {k1}\n",
             lambda r: (r.randint(0, 30), r.randint(0, 30)), (("k1", 5, 12),)),
    Template("balance", ("balance", "pos_minus_neg"), "def {f}({xs}):\n    {acc} = 0\n    for {e} in {xs}:\n"
             "        if {e} < 0:\n            {acc} -= 1\n        elif {e} > 0:\n            {acc} += 1\n    return {acc}\n",
             lambda r: (_ints(r, -3, 3),)),
    Template("pad", ("pad", "fill_right"), "def {f}({s}, {x}):\n    return {s} + '-' * ({x} - len({s}))\n",
             lambda r: (_word(r, 0, 5), r.randint(0, 8))),
    Template("cap_all", ("cap_all", "limit_each"), "def {f}({xs}, {x}):\n    return [min({e}, {x} + {k1}) for {e} in {xs}]\n",
             lambda r: (_ints(r), r.randint(-4, 3)), (("k1", 1, 3),)),
    Template("ceil_div", ("ceil_div", "num_pages"), "def {f}({x}):\n    return ({x} + {k1} - 1) // {k1}\n",
             lambda r: (r.randint(0, 40),), (("k1", 3, 9),)),
    Template("diffs", ("diffs", "deltas"), "def {f}({xs}):\n"
             "    return [{xs}[{i} + 1] - {xs}[{i}] for {i} in range(len({xs}) - 1)]\n", lambda r: (_ints(r, min_len=2),)),
    Template("is_sorted", ("is_sorted", "ascending"), "def {f}({xs}):\n    for {i} in range(len({xs}) - 1):\n"
             "        if {xs}[{i}] > {xs}[{i} + 1]:\n            return False\n    return True\n",
             lambda r: (sorted(_ints(r)) if r.random() < 0.5 else _ints(r),)),
    Template("count_range", ("count_range", "num_within"), "def {f}({xs}, {x}):\n    {acc} = 0\n    for {e} in {xs}:\n"
             "        if {e} >= {x} and {e} <= {x} + {k1}:\n            {acc} += 1\n    return {acc}\n",
             lambda r: (_ints(r, -5, 9), r.randint(-3, 3)), (("k1", 2, 5),)),
    Template("dedupe", ("dedupe", "unique_items"), "def {f}({xs}):\n    {out} = []\n    for {e} in {xs}:\n"
             "        if {e} not in {out}:\n            {out}.append({e})\n    return {out}\n",
             lambda r: (_ints(r, 0, 4, 2, 7),)),
    Template("zip_sum", ("zip_sum", "pairwise_add"), "def {f}({xs}, {ys}):\n"
             "    return [{e} + {i} for {e}, {i} in zip({xs}, {ys})]\n",
             lambda r: (lambda n: (_ints(r, min_len=n, max_len=n), _ints(r, min_len=n, max_len=n)))(r.randint(1, 5))),
    Template("rises", ("rises", "count_increases"), "def {f}({xs}):\n    {acc} = 0\n    for {i} in range(1, len({xs})):\n"
             "        if {xs}[{i}] > {xs}[{i} - 1]:\n            {acc} += 1\n    return {acc}\n",
             lambda r: (_ints(r, min_len=2, max_len=7),)),
    Template("last_digit", ("last_digit", "ones_place"), "def {f}({x}):\n    return abs({x}) % 10\n",
             lambda r: (r.randint(-999, 999),)),
    Template("to_minutes", ("to_minutes", "total_minutes"), "def {f}({x}, {y}):\n    return {x} * 60 + {y}\n",
             lambda r: (r.randint(0, 23), r.randint(0, 59))),
    Template("is_vowel", ("is_vowel", "vowel_check"), "def {f}({s}):\n    return {s} in 'aeiou'\n",
             lambda r: (r.choice("abcdeiouxyz"),)),
    Template("product", ("product", "multiply_all"), "def {f}({xs}):\n    {acc} = 1\n    for {e} in {xs}:\n"
             "        {acc} *= {e}\n    return {acc}\n", lambda r: (_ints(r, -4, 5, 1, 5),)),
    Template("first_neg", ("first_neg", "first_negative"), "def {f}({xs}):\n    for {e} in {xs}:\n"
             "        if {e} < 0:\n            return {e}\n    return 0\n", lambda r: (_ints(r, -6, 6),)),
    Template("norm_sq", ("norm_sq", "hypot_sq"), "def {f}({x}, {y}):\n    return {x} * {x} + {y} * {y}\n",
             lambda r: (r.randint(-9, 9), r.randint(-9, 9))),
    Template("middle_char", ("middle_char", "center_letter"), "def {f}({s}):\n    return {s}[len({s}) // 2]\n",
             lambda r: (_word(r, 1, 7),)),
    Template("rotate", ("rotate", "shift_left"), "def {f}({xs}):\n    return {xs}[{k1}:] + {xs}[:{k1}]\n",
             lambda r: (_ints(r, min_len=3, max_len=7),), (("k1", 1, 2),)),
    Template("mid_avg", ("mid_avg", "avg2"), "def {f}({x}, {y}):\n    return ({x} + {y}) // 2\n",
             lambda r: (r.randint(-20, 20), r.randint(-20, 20))),
]


def split_of(template_index: int) -> Split:
    """Every fourth template is held out; the rest are train. Stable across versions that only append."""
    return "heldout" if template_index % 4 == 3 else "train"


def templates_for(split: Split) -> list[Template]:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return [t for i, t in enumerate(TEMPLATES) if split_of(i) == split]


# ---------------------------------------------------------------------------------------------
# Instantiation and mutation


def _instantiate(t: Template, r: random.Random) -> tuple[str, str]:
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


def _sites(tree: ast.AST) -> list[tuple[str, int]]:
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


def _mutate(tree: ast.Module, kind: str, ordinal: int, r: random.Random) -> ast.Module:
    tree = copy.deepcopy(tree)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    node = list(ast.walk(tree))[ordinal]
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


# ---------------------------------------------------------------------------------------------
# In-process verification


_EXEC_LOCK = threading.Lock()


def _call(src: str, name: str, args: tuple) -> tuple[bool, Any]:
    """(ok, value or exception type name) of `name(*args)` in a fresh namespace."""
    ns: dict[str, Any] = {}
    try:
        exec(compile(src, "<synth>", "exec"), ns)
        return True, ns[name](*copy.deepcopy(args))
    except Exception as err:  # a mutant may raise anything; that is a failing behaviour
        return False, type(err).__name__


def run_tests_inprocess(module: str, module_src: str, test_src: str) -> dict[str, bool]:
    """Exec `test_src` against `module_src` installed as `module`; {test function name: passed}."""
    mod = types.ModuleType(module)
    results: dict[str, bool] = {}
    with _EXEC_LOCK:
        saved = sys.modules.get(module)
        sys.modules[module] = mod
        try:
            exec(compile(module_src, f"{module}.py", "exec"), mod.__dict__)
            ns: dict[str, Any] = {}
            exec(compile(test_src, f"test_{module}.py", "exec"), ns)
            for name, fn in ns.items():
                if name.startswith("test_") and callable(fn):
                    try:
                        fn()
                        results[name] = True
                    except Exception:
                        results[name] = False
        except Exception:
            return {}
        finally:
            if saved is None:
                sys.modules.pop(module, None)
            else:
                sys.modules[module] = saved
    return results


# ---------------------------------------------------------------------------------------------
# Tasks


def _call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _test_file(module: str, names: list[str], cases: list[tuple[str, str, tuple, Any]]) -> str:
    """cases: (test name, function, args, expected)."""
    lines = [f"from {module} import {', '.join(sorted(set(names)))}", ""]
    for test, fn, args, expected in cases:
        lines += ["", f"def {test}():", f"    assert {_call_text(fn, args)} == {expected!r}", ""]
    return "\n".join(lines)


def _line_diff(old: str, new: str) -> tuple[list[str], list[str]]:
    """The changed lines (old side, new side) between two sources, as one block."""
    a, b = old.splitlines(), new.splitlines()
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return [], []
    i1, j1 = ops[0][1], ops[0][3]
    i2, j2 = ops[-1][2], ops[-1][4]
    return a[i1:i2], b[j1:j2]


_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def minimal_edit(old_line: str, new_line: str, current: str, target: str) -> tuple[str, str] | None:
    """The shortest (old, new) pair of whole-token spans of one changed line such that replacing the single
    occurrence of `old` in `current` by `new` gives `target`. Easy statements quote it, the oracle applies
    it: copying `+ 34` → `+ 32` is what a small model can learn, a whole line is much harder."""
    a, b = _TOKEN.findall(old_line), _TOKEN.findall(new_line)
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    q = 0
    while q < min(len(a), len(b)) - p and a[-1 - q] == b[-1 - q]:
        q += 1
    lo, hi_a, hi_b = p, len(a) - q, len(b) - q
    while True:
        old, new = "".join(a[lo:hi_a]), "".join(b[lo:hi_b])
        if old.strip() and new.strip():
            for o, n in ((old.strip(), new.strip()), (old, new)):
                if current.count(o) == 1 and current.replace(o, n, 1) == target:
                    return o, n
        if lo > 0:
            lo -= 1
        elif hi_a < len(a) and hi_b < len(b):
            hi_a, hi_b = hi_a + 1, hi_b + 1
        else:
            return None


def _cases(t: Template, r: random.Random, name: str, src: str, num: int) -> list[tuple[tuple, Any]]:
    seen: set[str] = set()
    out: list[tuple[tuple, Any]] = []
    for _ in range(num * 8):
        args = t.args(r)
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        ok, value = _call(src, name, args)
        if ok:
            out.append((args, value))
        if len(out) == num:
            break
    return out


def _make_task(r: random.Random, split: Split, difficulty: str, task_id: str) -> Task | None:
    pool = templates_for(split)
    t = r.choice(pool)
    name, src = _instantiate(t, r)
    module = r.choice(MODULE_NAMES)
    cases = _cases(t, r, name, src, NUM_VISIBLE_CASES + NUM_HIDDEN_CASES)
    if len(cases) < NUM_VISIBLE_CASES + 2:
        return None
    tree = ast.parse(src)
    sites = _sites(tree)
    kinds = sorted({k for k, _ in sites})
    r.shuffle(kinds)
    for kind in kinds:
        for _, ordinal in r.sample([s for s in sites if s[0] == kind], k=sum(1 for s in sites if s[0] == kind)):
            mutant = ast.unparse(_mutate(tree, kind, ordinal, r)) + "\n"
            if mutant == src:
                continue
            old_lines, new_lines = _line_diff(mutant, src)
            if difficulty == "easy" and (len(old_lines) != 1 or len(new_lines) != 1
                                         or mutant.count(old_lines[0].strip()) != 1):
                continue
            outcomes = [(args, want, _call(mutant, name, args)) for args, want in cases]
            failing = [i for i, (_, want, got) in enumerate(outcomes) if not (got[0] and got[1] == want)]
            if not failing:
                continue  # equivalent on these inputs: try another site
            return _assemble(r, t, split, difficulty, task_id, module, name, src, mutant, kind, cases, failing,
                             outcomes[failing[0]], old_lines, new_lines)
    return None


def easy_statement(mod_file: str, name: str, old: str, new: str) -> str:
    """The `easy` problem statement: it names the file and quotes the exact edit."""
    return f"In `{mod_file}`, function `{name}` returns the wrong value: `{old}` should be `{new}`."


def _assemble(r, t, split, difficulty, task_id, module, name, src, mutant, kind, cases, failing, first_fail,
              old_lines, new_lines) -> Task | None:
    # Visible cases: the first failing one and a passing one, so `run_tests` shows the bug.
    passing = [i for i in range(len(cases)) if i not in failing]
    visible_idx = [failing[0]] + passing[:1] if passing else failing[:2]
    hidden_idx = [i for i in range(len(cases)) if i not in visible_idx]
    names = [name]
    module_src, orig_src = mutant, src
    if difficulty == "hard":  # a second, correct function from another template of the same split
        others = [o for o in templates_for(split) if o.id != t.id]
        o = r.choice(others)
        o_name, o_src = _instantiate(o, r)
        if o_name == name:
            return None
        o_cases = _cases(o, r, o_name, o_src, 2)
        if len(o_cases) < 2:
            return None
        before = r.random() < 0.5
        module_src = (o_src + "\n\n" + mutant) if before else (mutant + "\n\n" + o_src)
        orig_src = (o_src + "\n\n" + src) if before else (src + "\n\n" + o_src)
        names.append(o_name)
    vis = [(f"test_{k}", name, cases[i][0], cases[i][1]) for k, i in enumerate(visible_idx)]
    hid = [(f"test_h{k}", name, cases[i][0], cases[i][1]) for k, i in enumerate(hidden_idx)]
    if difficulty == "hard":
        hid += [(f"test_h{len(hid) + k}", names[1], a, v) for k, (a, v) in enumerate(o_cases)]
    vis_file, hid_file = f"test_{module}.py", f"test_{module}_hidden.py"
    vis_src, hid_src = _test_file(module, names, vis), _test_file(module, names, hid)
    # Verify the files themselves: the original passes every test, the mutant fails at least one.
    f2p, p2p = [], []
    for path, tsrc in ((vis_file, vis_src), (hid_file, hid_src)):
        good = run_tests_inprocess(module, orig_src, tsrc)
        bad = run_tests_inprocess(module, module_src, tsrc)
        if not good or not all(good.values()):
            return None
        for test in good:
            (p2p if bad.get(test, False) else f2p).append(f"{path}::{test}")
    if not f2p:
        return None
    args, want, (ok, got) = first_fail
    call = _call_text(name, args)
    got_text = f"{got!r}" if ok else f"raises {got}"
    mod_file = f"{module}.py"
    edit = None
    if difficulty == "easy":
        edit = minimal_edit(old_lines[0], new_lines[0], module_src, orig_src)
        if edit is None:
            return None
        problem = easy_statement(mod_file, name, edit[0], edit[1])
    elif difficulty == "medium":
        problem = f"In `{mod_file}`, function `{name}` is wrong: `{call}` should return {want!r} but {got_text}."
    else:
        problem = f"`{call}` should return {want!r} but {got_text}. Fix the bug."
    return Task(
        id=task_id, problem=problem, files={mod_file: module_src, vis_file: vis_src}, visible_tests=[vis_file],
        hidden_files={vis_file: vis_src, hid_file: hid_src}, fail_to_pass=f2p, pass_to_pass=p2p,
        test_command="python -m pytest -q", solution={mod_file: orig_src},
        meta={"split": split, "difficulty": difficulty, "mutation": kind, "function": t.id, "name": name,
              "module": mod_file, "old": old_lines, "new": new_lines, **({"edit": list(edit)} if edit else {})})


RUNNERS = ("minitest", "pytest")


def _check_runner(runner: str) -> None:
    if runner not in RUNNERS:
        raise ValueError(f"test runner must be one of {RUNNERS}, got {runner!r}")


def with_runner(task: Task, runner: str) -> Task:
    """The task graded by `runner`: "pytest" as generated, or "minitest" — `runtests.py` shipped in the
    workspace and among the hidden files (so grading writes it back over any edit)."""
    _check_runner(runner)
    if runner == "pytest":
        return task
    import dataclasses

    src = runner_source()
    return dataclasses.replace(task, files={**task.files, RUNNER_FILE: src},
                               hidden_files={**task.hidden_files, RUNNER_FILE: src},
                               test_command=f"python {RUNNER_FILE} -q")


def generate_tasks(n: int, seed: int = 0, split: Split = "train", difficulty: str | None = None,
                   runner: str = "minitest") -> list[Task]:
    """`n` verified tasks; deterministic in (n, seed, split, difficulty). `difficulty=None` mixes all three."""
    _check_runner(runner)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES} or None, got {difficulty!r}")
    templates_for(split)  # validates split
    tasks: list[Task] = []
    attempt = 0
    while len(tasks) < n:
        if attempt > 50 * n + 100:
            raise RuntimeError(f"could only generate {len(tasks)} of {n} verified tasks")
        r = random.Random(f"{seed}:{split}:{difficulty}:{attempt}")
        attempt += 1
        level = difficulty or r.choice(DIFFICULTIES)
        # The id names everything the task depends on, so files generated with other settings can be merged.
        task = _make_task(r, split, level, f"synth-{split}-{seed}-{difficulty or 'mix'}-{len(tasks):05d}")
        if task is not None:
            tasks.append(with_runner(task, runner))
    return tasks


def write_tasks(path: str | Path, n: int, seed: int = 0, split: Split = "train",
                difficulty: str | None = None, runner: str = "minitest") -> list[Task]:
    """Generate and save as flywheel JSONL (readable by `flywheel.envs.tasks.load_tasks`)."""
    from flywheel.envs.tasks import save_tasks

    tasks = generate_tasks(n, seed=seed, split=split, difficulty=difficulty, runner=runner)
    save_tasks(tasks, path)
    return tasks


# ---------------------------------------------------------------------------------------------
# Oracle


def _unique_replacement(current: str, target: str) -> tuple[str, str] | None:
    """(old, new) such that replacing the single occurrence of `old` in `current` yields `target`."""
    a, b = current.splitlines(keepends=True), target.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return None
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    if i2 - i1 == 1 and j2 - j1 == 1:  # one line: the stripped text, as an easy statement quotes it
        old, new = a[i1].strip(), b[j1].strip()
        if old and current.count(old) == 1 and a[i1].replace(old, new, 1) == b[j1]:
            return old, new
    while True:
        old, new = "".join(a[i1:i2]), "".join(b[j1:j2])
        if old and current.count(old) == 1:
            return old, new
        if i1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        elif i2 < len(a):
            i2, j2 = i2 + 1, j2 + 1
        else:
            return None


def oracle_actions(task: Task) -> list[ToolCall]:
    """The known fix replayed through the tools: view, str_replace (or write), submit."""
    if not task.solution:
        raise ValueError(f"task {task.id!r} has no `solution`; the oracle needs the files of the fix")
    calls: list[ToolCall] = []
    for path, target in sorted(task.solution.items()):
        current = task.files.get(path)
        if current is None:
            calls.append(ToolCall("write", {"path": path, "content": target}, id=f"c{len(calls)}"))
            continue
        calls.append(ToolCall("view", {"path": path}, id=f"c{len(calls)}"))
        quoted = task.meta.get("edit") if path == task.meta.get("module") else None
        rep = tuple(quoted) if quoted else _unique_replacement(current, target)
        if rep is None and current != target:
            calls.append(ToolCall("write", {"path": path, "content": target}, id=f"c{len(calls)}"))
        elif rep is not None:
            calls.append(ToolCall("str_replace", {"path": path, "old": rep[0], "new": rep[1]}, id=f"c{len(calls)}"))
    calls.append(ToolCall("submit", {}, id=f"c{len(calls)}"))
    return calls


def task_summary(tasks: list[Task]) -> dict[str, Any]:
    """Counts by split, difficulty, mutation and function, for the CLI and the docs."""
    out: dict[str, dict[str, int]] = {"split": {}, "difficulty": {}, "mutation": {}, "function": {}}
    for t in tasks:
        for key in out:
            v = str(t.meta.get(key))
            out[key][v] = out[key].get(v, 0) + 1
    return json.loads(json.dumps(out))
