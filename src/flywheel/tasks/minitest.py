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

import importlib.machinery
import io
import os
import sys
import time

# Start-up is most of this runner's cost (a task's tests take ~1 ms), so the module imports only what every
# run needs: no ast.py, traceback (only for syntax errors), linecache, ElementTree (the JUnit XML is written
# by hand), contextlib or importlib.util. Those imports doubled the time of a run in a sandbox (docs/environments.md).


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
    name, location = os.path.basename(path)[:-3], os.path.abspath(path)
    loader = importlib.machinery.SourceFileLoader(name, location)  # importlib.util's spec_from_file_location
    spec = importlib.machinery.ModuleSpec(name, loader, origin=location)
    spec.has_location = True
    module = type(sys)(name)
    module.__spec__, module.__loader__, module.__file__ = spec, loader, location
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def collect(module, only: list[list[str]] | None) -> list[tuple[list[str], object]]:
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


_OPS = {"Eq": "==", "NotEq": "!=", "Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Is": "is", "IsNot": "is not",
        "In": "in", "NotIn": "not in"}


def source_line(filename: str, lineno: int) -> str:
    """Line `lineno` of a source file, stripped ("" where it cannot be read): linecache without its imports."""
    try:
        with open(filename, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, start=1):
                if n == lineno:
                    return line.strip()
    except OSError:
        pass
    return ""


def explain(tb) -> list[str]:
    """For a failing `assert a OP b`: the values of both sides, evaluated in the failing frame."""
    import _ast as ast  # the node classes and compile()'s AST flag, without ast.py's helpers (~20 ms to import)

    while tb.tb_next is not None:
        tb = tb.tb_next
    frame, lineno = tb.tb_frame, tb.tb_lineno
    line = source_line(frame.f_code.co_filename, lineno)
    try:
        node = compile(line, "<assert>", "exec", ast.PyCF_ONLY_AST).body[0]  # type: ignore[attr-defined]
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
    op_src = _OPS.get(type(node.test.ops[0]).__name__, "?")
    out = [f"assert {values[0]!r} {op_src} {values[1]!r}"]
    for side, value in zip(sides, values):
        if not isinstance(side, ast.Constant):
            out.append(f" +  where {value!r} = {line.encode()[side.col_offset:side.end_col_offset].decode()}")
    return out


def failure_text(err: BaseException) -> tuple[str, str]:
    """(one-line message, the report section) for a failed test, shaped like pytest's."""
    tb = last = err.__traceback__
    assert last is not None, "failure_text takes a raised exception"
    while last.tb_next is not None:  # the innermost frame (the runner's own frame when it is the only one)
        last = last.tb_next
    filename, lineno = last.tb_frame.f_code.co_filename, last.tb_lineno
    lines = [f">       {source_line(filename, lineno)}"]
    details = explain(tb) if isinstance(err, AssertionError) and not str(err) else []
    if details:
        lines += [f"E       {d}" for d in details]
        message = details[0]
    else:
        message = exception_only(err)
        lines += [f"E       {m}" for m in message.splitlines()]
    lines.append(f"{os.path.relpath(filename)}:{lineno}: {type(err).__name__}")
    return message.splitlines()[0] if message else type(err).__name__, "\n".join(lines)


def exception_only(err: BaseException) -> str:
    """`traceback.format_exception_only`, stripped; done here for the common case, as importing traceback
    costs more than running a task's tests."""
    if isinstance(err, SyntaxError) or getattr(err, "__notes__", None):
        import traceback

        return "".join(traceback.format_exception_only(type(err), err)).strip()
    kind = type(err)
    name = kind.__qualname__
    if kind.__module__ not in ("__main__", "builtins"):
        name = f"{kind.__module__}.{name}"
    try:
        text = str(err)
    except Exception:
        text = "<exception str() failed>"
    return f"{name}: {text}".strip() if text else name


# XML 1.0 cannot hold most control characters: a test printing one would make the report unreadable.
_XML_BAD = {c: "\ufffd" for c in [*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0xFFFE, 0xFFFF]}
_XML_TEXT = {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;", **_XML_BAD}
_XML_ATTR = {**_XML_TEXT, ord('"'): "&quot;", ord("\n"): "&#10;", ord("\r"): "&#13;", ord("\t"): "&#09;"}


def _attrs(**values: object) -> str:
    return "".join(f' {k}="{str(v).translate(_XML_ATTR)}"' for k, v in values.items())


def write_junit(path: str, results: list[dict], elapsed_s: float) -> None:
    """pytest's JUnit XML shape (testsuites > testsuite > testcase [> failure|error]), written by hand."""
    counts = {s: sum(r["status"] == s for r in results) for s in ("failed", "error")}
    suite = _attrs(name="runtests", tests=len(results), failures=counts["failed"], errors=counts["error"],
                   time=f"{elapsed_s:.3f}")
    out = ["<?xml version='1.0' encoding='utf-8'?>\n<testsuites>", f"<testsuite{suite}>"]
    for r in results:
        case = _attrs(classname=r["classname"], name=r["name"], time=f"{r['time']:.3f}")
        if r["status"] in ("failed", "error"):
            tag = "failure" if r["status"] == "failed" else "error"
            body = r["report"].translate(_XML_TEXT)
            out.append(f"<testcase{case}><{tag}{_attrs(message=r['message'])}>{body}</{tag}></testcase>")
        else:
            out.append(f"<testcase{case} />")
    out.append("</testsuite></testsuites>")
    with open(path, "w", encoding="utf-8", errors="replace") as f:  # errors: lone surrogates from a test's output
        f.write("".join(out))


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
            import traceback

            sections.append(f"ERROR collecting {path}\n" + "".join(traceback.format_exception(err)).rstrip())
            continue
        for parts, test in collect(module, only):
            buf = io.StringIO()
            start = time.perf_counter()
            real_stdout, sys.stdout = sys.stdout, buf  # contextlib.redirect_stdout, without importing contextlib
            try:
                _call(test)
                status, message, report = "passed", "", ""
            except (Exception, SystemExit, KeyboardInterrupt) as err:
                status = "failed"
                sys.stdout = real_stdout  # as redirect_stdout's exit did: failure_text re-evaluates the assert
                message, report = failure_text(err)
                if buf.getvalue():
                    report += "\n----- Captured stdout call -----\n" + buf.getvalue().rstrip()
            finally:
                sys.stdout = real_stdout
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
