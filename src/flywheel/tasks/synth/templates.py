"""The function templates of the synthetic tasks, their names and the train / held-out split.

    templates_for("train")     # every template whose index is not a multiple of four

Held-out templates (every fourth) never appear in train, so held-out pass@1 measures generalisation to functions
the policy has never seen. The generator itself: tasks/synth/generate.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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
