"""A pytest-compatible test runner in one standard-library file, for tasks whose tests are plain functions.

Why: pytest takes ~0.45 s of CPU to start here; a synthetic task's tests run in ~1 ms. RL grades every
session (and the agent runs the visible tests itself), so on a 2-core machine pytest start-up was the
largest single cost of a rollout. This runner starts in ~20 ms. Synthetic tasks ship it as `runtests.py`
(`synth.test_runner = "minitest"`, the default; `"pytest"` restores pytest) with
`test_command = "python runtests.py"`; grading restores it from the task like a test file, so an agent that
edits it changes nothing but its own tool output (and is flagged `tests_edited`).

It speaks the part of pytest's interface that grading and the harness use:

    python runtests.py [-q] [-p PLUGIN] [--junitxml=FILE] [PATH[::TEST] | PATH[::CLASS::TEST] ...]

and prints pytest-style output (`..F`, a failure section with the failing assert's values, `FAILED id -
message` lines, `1 failed, 6 passed`). The summary line leaves out pytest's wall time: tool output is what
the policy reads and what mid-training transcripts are made of, and a timing there made one seed give another
corpus under another machine load (the JUnit XML keeps the times). The JUnit XML is written after every test
has run, with pytest's `classname`/`name` convention (module path dotted, then the class), so
`reward.parse_junit` reads it unchanged. Collected: module-level `test*` functions and `Test*` classes
without `__init__` (their `test*` methods, `setup_method`/`teardown_method` honoured). Not supported, and
reported as an error of the test: fixtures (test functions with parameters), marks, parametrize. Exit status
as pytest: 0 all passed, 1 some failed, 2 usage or collection errors, 5 nothing collected.

This file must stay importable with the standard library alone: it runs inside the sandbox, where flywheel
is not installed. Tests: tests/unit/test_minitest.py.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import linecache
import os
import sys
import time
import traceback
import xml.etree.ElementTree as ET


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """(junit xml path or None, targets). Options pytest takes that do not matter here are accepted."""
    junit, targets, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--junitxml="):
            junit = a.split("=", 1)[1]
        elif a == "--junitxml" and i + 1 < len(argv):
            junit, i = argv[i + 1], i + 1
        elif a in ("-p", "-k", "-m") and i + 1 < len(argv):
            i += 1
        elif a.startswith("-"):
            pass  # -q, -x, -v, --tb=short, ...: output detail only
        else:
            targets.append(a)
        i += 1
    return junit, targets


def discover(root: str = ".") -> list[str]:
    """pytest's default file discovery: test_*.py and *_test.py, hidden and cache directories skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") and (f.startswith("test_") or f.endswith("_test.py")):
                found.append(os.path.relpath(os.path.join(dirpath, f), root))
    return found


def _load(path: str):
    """Import a test file by its base name with its directory first on sys.path (pytest's `prepend` mode)."""
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def collect(module, only: list[str] | None) -> list[tuple[list[str], object]]:
    """[(name parts after the file, callable)] in definition order, restricted to node ids in `only`."""
    items: list[tuple[list[str], object]] = []
    for name, obj in vars(module).items():
        if name.startswith("test") and callable(obj) and not isinstance(obj, type):
            items.append(([name], obj))
        elif name.startswith("Test") and isinstance(obj, type) and "__init__" not in vars(obj):
            for meth in vars(obj):
                if meth.startswith("test") and callable(getattr(obj, meth)):
                    items.append(([name, meth], (obj, meth)))
    if only:
        items = [it for it in items if any(it[0][: len(o)] == o for o in only)]
    return items


def _call(test) -> None:
    if isinstance(test, tuple):
        cls, meth = test
        inst = cls()
        if hasattr(inst, "setup_method"):
            inst.setup_method(getattr(inst, meth))
        try:
            _no_fixtures(getattr(inst, meth))()
        finally:
            if hasattr(inst, "teardown_method"):
                inst.teardown_method(getattr(inst, meth))
    else:
        _no_fixtures(test)()


def _no_fixtures(fn):
    code = getattr(fn, "__code__", None)
    wanted = code.co_argcount - (1 if hasattr(fn, "__self__") else 0) if code else 0
    if wanted > 0:
        raise TypeError(f"{fn.__name__} takes arguments (pytest fixtures), which runtests.py does not provide")
    return fn


_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


def explain(tb) -> list[str]:
    """For a failing `assert a OP b`: the values of both sides, evaluated in the failing frame."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame, lineno = tb.tb_frame, tb.tb_lineno
    line = linecache.getline(frame.f_code.co_filename, lineno).strip()
    try:
        node = ast.parse(line).body[0]
    except (SyntaxError, IndexError):
        return []
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return []
    sides = [node.test.left, node.test.comparators[0]]
    try:
        values = [eval(compile(ast.Expression(s), "<assert>", "eval"), frame.f_globals, frame.f_locals)
                  for s in sides]
    except Exception:  # re-evaluating has side effects or fails: show the line only
        return []
    op_src = _OPS.get(type(node.test.ops[0]), "?")
    out = [f"assert {values[0]!r} {op_src} {values[1]!r}"]
    for side, value in zip(sides, values):
        if not isinstance(side, ast.Constant):
            out.append(f" +  where {value!r} = {ast.get_source_segment(line, side)}")
    return out


def failure_text(err: BaseException) -> tuple[str, str]:
    """(one-line message, the report section) for a failed test, shaped like pytest's."""
    tb = err.__traceback__
    frames = traceback.extract_tb(tb)[1:] or traceback.extract_tb(tb)  # drop the runner's own frame
    last = frames[-1]
    lines = [f">       {last.line}"]
    details = explain(tb) if isinstance(err, AssertionError) and not str(err) else []
    if details:
        lines += [f"E       {d}" for d in details]
        message = details[0]
    else:
        message = "".join(traceback.format_exception_only(type(err), err)).strip()
        lines += [f"E       {m}" for m in message.splitlines()]
    lines.append(f"{os.path.relpath(last.filename)}:{last.lineno}: {type(err).__name__}")
    return message.splitlines()[0] if message else type(err).__name__, "\n".join(lines)


def write_junit(path: str, results: list[dict], elapsed_s: float) -> None:
    suite = ET.Element("testsuite", name="runtests", tests=str(len(results)),
                       failures=str(sum(r["status"] == "failed" for r in results)),
                       errors=str(sum(r["status"] == "error" for r in results)), time=f"{elapsed_s:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r["classname"], name=r["name"], time=f"{r['time']:.3f}")
        if r["status"] in ("failed", "error"):
            ET.SubElement(case, "failure" if r["status"] == "failed" else "error", message=r["message"]).text = r["report"]
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def main(argv: list[str] | None = None) -> int:
    junit, targets = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    wanted: dict[str, list[list[str]]] = {}
    for t in targets or discover():
        path, *parts = t.split("::")
        wanted.setdefault(path, [])
        if parts:
            wanted[path].append(parts)
    results: list[dict] = []
    sections: list[str] = []
    errors = 0
    for path, only in wanted.items():
        module_path = path[:-3] if path.endswith(".py") else path
        classname = module_path.replace("/", ".").replace("\\", ".").lstrip(".")
        try:
            module = _load(path)
        except BaseException as err:  # a syntax error in the code under test is a collection error
            errors += 1
            sections.append(f"ERROR collecting {path}\n" + "".join(traceback.format_exception(err)).rstrip())
            continue
        for parts, test in collect(module, only):
            buf = io.StringIO()
            start = time.perf_counter()
            try:
                with contextlib.redirect_stdout(buf):
                    _call(test)
                status, message, report = "passed", "", ""
            except (Exception, SystemExit, KeyboardInterrupt) as err:
                status = "failed"
                message, report = failure_text(err)
                if buf.getvalue():
                    report += "\n----- Captured stdout call -----\n" + buf.getvalue().rstrip()
            node = "::".join([path, *parts])
            results.append({"classname": ".".join([classname, *parts[:-1]]), "name": parts[-1], "status": status,
                            "message": message, "report": report, "node": node,
                            "time": time.perf_counter() - start})
            print("." if status == "passed" else "F", end="", flush=True)
    print()
    failed = [r for r in results if r["status"] != "passed"]
    if failed or sections:
        print("=" * 20 + " FAILURES " + "=" * 20)
        for r in failed:
            print(f"{'_' * 10} {r['node'].split('::', 1)[1]} {'_' * 10}\n{r['report']}")
        for s in sections:
            print(s)
        print("=" * 15 + " short test summary info " + "=" * 15)
        for r in failed:
            print(f"FAILED {r['node']} - {r['message']}")
    elapsed = time.perf_counter() - t0
    counts = [f"{n} {word}" for n, word in ((len(failed), "failed"), (len(results) - len(failed), "passed"),
                                            (errors, "error" if errors == 1 else "errors")) if n]
    print(', '.join(counts) or 'no tests ran')
    if junit:
        write_junit(junit, results, elapsed)
    if errors:
        return 2
    if not results:
        return 5
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
