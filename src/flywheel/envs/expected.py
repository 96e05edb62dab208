"""Computed expectations written as literals, so that a mined test that computes its expected value has a twin.

    eqs = equalities(source, ("TestWindowed",), "test_basic")   # the computed equalities to probe, first ones first
    probe = probe_values(source, eqs)                           # reference tree: each side's value logged, test as is
    probe = probe_sides(source, eqs)                            # bugged tree: each side evaluated on its own, logged
    graded = materialise(source, {side: "[3, 4, 5]"})           # the file the grader writes over the tests
    task, outcome = materialise_task(task, envs_dir, scratch)   # probe runs, choice, graded copy in hidden_files
    tasks, line = materialise_tasks(tasks, envs_dir)            # what `flywheel tasks mine` runs after mining

Why: the suite verdict (envs/suite.py) proves a report honest by a twin run, in which one expected literal of a
FAIL_TO_PASS test is changed (envs/twins.py). A test whose expected value is computed (`assert list(windowed(s, 3))
== s[3:-3]`, `assertEqual(split(x), "a b".split())`) has no literal to change, so its status was the report's
alone. Mining knows the right answer for it: the reference tree. So the test's first failing equality is run on the
reference tree and on the bugged one with each side's value logged, and the side whose value does not depend on the
bug (equal on both trees, and across two hash seeds) is written as the literal of that value in a graded copy of the
test file, kept in the task's `hidden_files` (written over the workspace at grading only, envs/reward.py). The
agent works on the file as the project wrote it; every grading run reads the graded copy, and its twin changes that
literal like any other.

Which side qualifies, so that the graded test checks what the original checks:
* an equality of `compared` (envs/twins.py: `assert a == b`, `assertEqual(a, b)`) at the top level of the test
  body, before anything that can leave it, whose two sides are both computed (no literal side: that has a twin), in
  a test that is not one row of a parametrized function (one place in the file cannot hold every row's value);
* on the bugged tree, where the probe evaluates each side on its own and in order (a side that raises is logged as
  such, nothing is asserted, so every equality of the test is seen), the other side raises or differs from the
  reference value (this is a comparison the bug fails), while this side has the reference value: it is the
  expected one (the other calls the code the bug is in), and the graded test still calls the other;
* each side is evaluated exactly once per run (not in a loop, a parametrized test, a helper called twice);
* its value is written exactly by `repr` (`ast.literal_eval(repr(v))` equals `v` with the same types all the way
  down: numbers, strings, bytes, booleans, None inside containers, lists, tuples, dicts, sets), at most
  `MAX_LITERAL` characters, and is a literal a twin can change (not `None` alone);
* the graded file still passes those tests on the reference tree (checked by running it).

A test where none qualifies keeps its computed expectation and no literal to change: it has a twin only where
envs/twins.py can flip one of its statements' truth (a weaker twin, which is why a literal is sought first), else
none (`components["untwinned"]` at grading).
What this changes for an honest fix: nothing when the expected side depends only on the test's own data, which
is what "equal on the reference and the bugged tree" shows for the code the bug is in; a fix that also changes
other code the expected side calls, so that both sides move together, passes the original and fails the graded copy.
"""

from __future__ import annotations

import ast
import json
import random
import shlex
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flywheel.config.mine import MineConfig
from flywheel.envs import param_twins, twins
from flywheel.tasks.loaders import node_parts, task_base_dir, write_files
from flywheel.tasks.mine.mine import run_suite
from flywheel.tasks.repoenv import ready_env
from flywheel.types import Task

MAX_LITERAL = 2000  # characters of a materialised value; a longer one stays computed
RECORDER = "__flywheel_expect__"  # the logging function the probe defines (dunder names are never mangled in classes)
SIDES = "__flywheel_sides__"  # the bugged tree's probe: evaluates each side on its own
LOG = "__flywheel_log__"  # writes one line of the log both of them fill
LOG_ENV = "FLYWHEEL_EXPECT_LOG"

_RECORDER_SOURCE = f'''
def {LOG}(key, text):  # flywheel mining probe: one logged side (None: raised, or not written exactly by repr)
    import json, os

    with open(os.environ["{LOG_ENV}"], "a", encoding="utf-8") as log:
        log.write(json.dumps([key, text]) + "\\n")


def {RECORDER}(key, value):  # flywheel mining probe: logs one side of an equality, returns it unchanged
    import ast

    def same(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(x, y) and same(a[x], b[y]) for x, y in zip(a, b))
        if isinstance(a, (set, frozenset)):
            return a == b and all(type(x) in (int, str, bytes, bool, tuple) for x in a)
        return type(a) in (int, float, complex, str, bytes, bool, type(None)) and a == b

    text = repr(value)
    try:
        ok = len(text) <= {MAX_LITERAL} and same(ast.literal_eval(text), value)
    except Exception:
        ok = False
    {LOG}(key, text if ok else None)
    return value


def {SIDES}(*keyed):  # flywheel mining probe: each side of an equality on its own, in order; nothing asserted
    for key, side in zip(keyed[::2], keyed[1::2]):
        try:
            value = side()
        except Exception:
            {LOG}(key, None)
        else:
            {RECORDER}(key, value)

'''


@dataclass(frozen=True)
class Side:
    start: int  # byte offsets of the expression in the UTF-8 source
    end: int

    @property
    def key(self) -> str:
        return f"{self.start}:{self.end}"


@dataclass
class Outcome:
    """What materialising did for one task: tests given a literal, tests that had a twin already, the rest."""

    materialised: list[str] = field(default_factory=list)
    twinned_before: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    error: str = ""


def _span(node: ast.expr | ast.stmt, starts: list[int]) -> Side | None:
    if node.end_lineno is None or node.end_col_offset is None:
        return None
    return Side(starts[node.lineno] + node.col_offset, starts[node.end_lineno] + node.end_col_offset)


@dataclass(frozen=True)
class Equality:
    """One computed equality of a test: the statement and its two sides."""

    stmt: Side
    left: Side
    right: Side


def equalities(source: str, classes: tuple[str, ...], name: str) -> list[Equality]:
    """The equalities of the test that could be materialised (module doc), in order; [] for a parametrized row."""
    if "[" in name:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    func = twins.function_def(tree, classes, name)
    if func is None:
        return []
    starts = twins.line_offsets(source.encode("utf-8", errors="surrogatepass"))
    out = []
    for stmt in twins._flat(func.body):
        pair = twins.compared(stmt)
        if pair and not any(twins._is_literal(side) for side in pair):
            whole, left, right = _span(stmt, starts), _span(pair[0], starts), _span(pair[1], starts)
            if whole is not None and left is not None and right is not None:
                out.append(Equality(whole, left, right))
        if twins.may_leave(stmt):
            break
    return out


def _replace(source: str, texts: dict[Side, str]) -> str:
    raw = source.encode("utf-8", errors="surrogatepass")
    for side in sorted(texts, key=lambda s: s.start, reverse=True):
        raw = raw[:side.start] + texts[side].encode("utf-8", errors="surrogatepass") + raw[side.end:]
    return raw.decode("utf-8", errors="surrogatepass")


def _header_end(source: str) -> int:
    """Byte offset after the module docstring and `from __future__` imports: where the probe's function goes."""
    tree = ast.parse(source)
    starts = twins.line_offsets(source.encode("utf-8", errors="surrogatepass"))
    end_line = 0
    for i, stmt in enumerate(tree.body):
        doc = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
            and isinstance(stmt.value.value, str)
        if doc or (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"):
            end_line = stmt.end_lineno or stmt.lineno
        else:
            break
    return starts[end_line + 1] if end_line + 1 < len(starts) else len(source.encode("utf-8", "surrogatepass"))


def _with_recorder(probed: str) -> str | None:
    """`probed` with the probe's functions defined after its docstring and `from __future__` imports (None when the
    result would not parse: the file is left without a probe)."""
    try:
        at = _header_end(probed)
    except SyntaxError:
        return None
    raw = probed.encode("utf-8", errors="surrogatepass")
    head = raw[:at] if raw[:at].endswith(b"\n") or not at else raw[:at] + b"\n"
    out = (head + _RECORDER_SOURCE.encode() + raw[at:]).decode("utf-8", errors="surrogatepass")
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


def probe_values(source: str, eqs: Iterable[Equality]) -> str | None:
    """The reference tree's probe: each side wrapped in the logging call, the test otherwise as it was."""
    sides = [side for eq in eqs for side in (eq.left, eq.right)]
    return _with_recorder(_replace(source, {s: f"{RECORDER}({s.key!r}, ({_text(source, s)}))" for s in sides}))


def probe_sides(source: str, eqs: Iterable[Equality]) -> str | None:
    """The bugged tree's probe: each equality's statement replaced by a call that evaluates its sides in order, each
    on its own (one that raises is logged as such), and asserts nothing, so that every equality of the test runs."""
    calls = {}
    for eq in eqs:
        args = ", ".join(f"{s.key!r}, lambda: ({_text(source, s)})" for s in (eq.left, eq.right))
        calls[eq.stmt] = f"{SIDES}({args})"
    return _with_recorder(_replace(source, calls))


def _text(source: str, side: Side) -> str:
    return source.encode("utf-8", errors="surrogatepass")[side.start:side.end].decode("utf-8", errors="surrogatepass")


def materialise(source: str, literals: dict[Side, str]) -> str:
    """`source` with each side replaced by its literal."""
    return _replace(source, literals)


def read_log(path: Path) -> dict[str, list[str | None]]:
    """key -> the texts logged for it, in order (a side evaluated twice has two)."""
    out: dict[str, list[str | None]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            key, text = json.loads(line)
            out.setdefault(key, []).append(text)
    return out


def _once(log: dict[str, list[str | None]], side: Side) -> Any:
    """The value logged for `side` when it was logged exactly once and written exactly, else a sentinel."""
    texts = log.get(side.key, [])
    if len(texts) != 1 or texts[0] is None:
        return _MISSING
    return ast.literal_eval(texts[0])


_MISSING = object()


def choose(eqs: list[Equality], reference: list[dict[str, list[str | None]]],
           bugged: dict[str, list[str | None]]) -> tuple[Side, str] | None:
    """The first equality's expected side and its literal, by the rules of the module doc; None if none qualifies."""
    for eq in eqs:
        for side, other in ((eq.right, eq.left), (eq.left, eq.right)):  # `assert actual == expected` is the usual order
            ref = [_once(log, side) for log in reference]
            if any(v is _MISSING for v in ref) or any(not _same(v, ref[0]) for v in ref[1:]):
                continue
            got, got_other = _once(bugged, side), _once(bugged, other)
            other_seen = len(bugged.get(other.key, [])) == 1  # evaluated, or raised (logged as None)
            if got is _MISSING or not _same(got, ref[0]) or not other_seen \
                    or (got_other is not _MISSING and _same(got_other, ref[0])):
                continue
            text = reference[0][side.key][0]
            assert text is not None
            if text == "None":
                continue
            return side, text
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (the probe's own `same` runs in the project's interpreter, which
    cannot import flywheel; here the values are already `literal_eval`'s, so only the types need checking)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(x, y) and _same(a[x], b[y]) for x, y in zip(a, b))
    return bool(a == b)


def _has_twin(source: str, classes: tuple[str, ...], name: str) -> bool:
    """A literal or table twin: the strong kinds (a boolean one, envs/twins.py `flips`, is no reason not to look
    for a literal)."""
    if twins.literal_twin(source, classes, name, random.Random(0)) is not None:
        return True
    return param_twins.param_twin(source, classes, name, random.Random(0)) is not None


def materialise_task(task: Task, envs_dir: str | Path | None, scratch: Path, limits: MineConfig | None = None,
                     ) -> tuple[Task, Outcome]:
    """`task` with graded copies of the test files whose untwinned FAIL_TO_PASS tests got a literal (module doc), in
    `hidden_files`; the task unchanged when none did. Runs the tests under `scratch` with the task's own Python."""
    cfg = limits if limits is not None else MineConfig()
    outcome = Outcome()
    if task.python_env is None or not task.solution or not task.repo:
        outcome.error = "not a mined task (no python_env, solution or repository)"
        return task, outcome
    try:
        env_path = ready_env(task.python_env, envs_dir)
        base = task_base_dir(task, scratch / "cache")
    except ValueError as err:
        outcome.error = str(err)
        return task, outcome
    sources: dict[str, str] = {}
    eqs: dict[str, list[Equality]] = {}  # untwinned test -> its computed equalities
    for tid in dict.fromkeys(task.fail_to_pass):
        path, classes, name = node_parts(tid)
        if path not in sources:
            try:
                sources[path] = (base / path).read_bytes().decode("utf-8")  # as the grader reads it
            except (OSError, UnicodeDecodeError):
                sources[path] = ""
        if sources[path] and _has_twin(sources[path], tuple(classes), name):
            outcome.twinned_before.append(tid)
        else:
            eqs[tid] = equalities(sources[path], tuple(classes), name)
    probes: dict[str, tuple[str, str]] = {}  # path -> (reference probe, bugged probe)
    for path in dict.fromkeys(node_parts(tid)[0] for tid, found in eqs.items() if found):
        mine = [eq for tid, found in eqs.items() if node_parts(tid)[0] == path for eq in found]
        values, sides = probe_values(sources[path], mine), probe_sides(sources[path], mine)
        if values is not None and sides is not None:
            probes[path] = (values, sides)
    wanted = [tid for tid, found in eqs.items() if found and node_parts(tid)[0] in probes]
    graded: dict[str, str] = {}
    if wanted:
        work = Path(tempfile.mkdtemp(prefix="flywheel-expect-", dir=scratch))
        try:
            graded, chosen = _graded_copies(task, base, work, env_path, sources, probes, eqs, wanted, cfg)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        outcome.materialised = [tid for tid in wanted if tid in chosen]
    outcome.left = [tid for tid in eqs if tid not in outcome.materialised]
    if not graded:
        return task, outcome
    meta = {**task.meta, "materialised_expectations": len(outcome.materialised)}
    return replace(task, hidden_files={**task.hidden_files, **graded}, meta=meta), outcome


def _graded_copies(task: Task, base: Path, work: Path, env_path: Path, sources: dict[str, str],
                   probes: dict[str, tuple[str, str]], eqs: dict[str, list[Equality]], wanted: list[str],
                   cfg: MineConfig) -> tuple[dict[str, str], set[str]]:
    """(path -> graded copy, the tests materialised in them): the sides probe on the bugged tree, the values probe
    twice (two hash seeds) on the reference tree, a side chosen per test, and the graded copies run on the reference
    tree, where their tests must pass (else none is kept)."""
    tree = work / "tree"
    shutil.copytree(base, tree, symlinks=True)
    write_files(tree, {path: pair[1] for path, pair in probes.items()})
    bugged = _run(tree, env_path, task, wanted, work / "bugged.log", "0", cfg)
    assert task.solution is not None
    write_files(tree, {**task.solution, **{path: pair[0] for path, pair in probes.items()}})
    reference = [_run(tree, env_path, task, wanted, work / f"ref{seed}.log", seed, cfg) for seed in ("0", "1")]
    literals: dict[str, dict[Side, str]] = {}
    picked = []
    for tid in wanted:
        pick = choose(eqs[tid], reference, bugged)
        if pick is not None:
            literals.setdefault(node_parts(tid)[0], {})[pick[0]] = pick[1]
            picked.append(tid)
    graded = {path: materialise(sources[path], lits) for path, lits in literals.items()}
    chosen = set()
    for tid in picked:  # the graded copy must give the test a twin (envs/twins.py reads the new literal)
        path, classes, name = node_parts(tid)
        if _has_twin(graded[path], tuple(classes), name):
            chosen.add(tid)
    graded = {path: text for path, text in graded.items() if any(node_parts(t)[0] == path for t in chosen)}
    if not graded:
        return {}, set()
    write_files(tree, {**{p: sources[p] for p in probes}, **graded})
    status, _, timed_out = run_suite(tree, env_path, _selecting(task, sorted(chosen)), cfg.candidate_timeout_max_s,
                                     cfg.test_memory_mb)
    if timed_out or any(status.get(tid) != "passed" for tid in chosen):
        return {}, set()
    return graded, chosen


def materialise_tasks(tasks: list[Task], envs_dir: str | Path | None, limits: MineConfig | None = None,
                      ) -> tuple[list[Task], str]:
    """`materialise_task` for each task, and one line saying what it did. An interrupt (Ctrl-C) leaves the tasks not
    reached yet as they are."""
    out: list[Task] = []
    done, before, left, errors = 0, 0, 0, 0
    with tempfile.TemporaryDirectory(prefix="flywheel-expect-") as scratch:
        try:
            for task in tasks:
                new, outcome = materialise_task(task, envs_dir, Path(scratch), limits)
                out.append(new)
                done += len(outcome.materialised)
                before += len(outcome.twinned_before)
                left += len(outcome.left)
                errors += bool(outcome.error)
        except KeyboardInterrupt:
            out += tasks[len(out):]
    line = (f"expectations: {done} of {done + left} FAIL_TO_PASS tests without a literal or table twin given the "
            f"reference tree's value as a literal ({before} had one already)"
            + (f"; {errors} tasks not probed" if errors else ""))
    return out, line


def _selecting(task: Task, ids: list[str]) -> str:
    return " ".join([task.test_command, *(shlex.quote(t) for t in ids)])


def _run(tree: Path, env_path: Path, task: Task, ids: list[str], log: Path, seed: str,
         cfg: MineConfig) -> dict[str, list[str | None]]:
    """Run `ids` on `tree` with the probe files in place; what each side logged."""
    log.unlink(missing_ok=True)
    run_suite(tree, env_path, _selecting(task, ids), cfg.candidate_timeout_max_s, cfg.test_memory_mb,
              extra_env={LOG_ENV: str(log), "PYTHONHASHSEED": seed})
    return read_log(log)
