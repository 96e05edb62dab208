"""Out-of-band grading signals: signed proofs of completed tests and per-grading canaries.

    armed = arm(root, test_files)                  # after the tree is restored, before the sandbox runs
    sb.run(command, env={"PYTHONPATH": armed.pythonpath(inner_root)})
    verdict = check(armed, sandbox_root, report, test_ids)
    verdict.report      # the JUnit statuses, a "passed" without a proof turned into "failed"
    verdict.tampered    # reasons (empty when every signal agrees)

Why: pytest, runtests.py and the code under test share one process, so the runner's report (JUnit XML, exit
status) is only as honest as that code; a solution can patch the runner to skip tests, rewrite the report at
exit, or replace a test's body. Two signals that do not pass through the runner decide instead:

* **Proofs.** `guard_site.py` is loaded as `sitecustomize` before anything else in the test process, takes a
  fresh per-grading key and deletes it from disk. Each test file grading runs gets one line appended that
  wraps its `test*` functions; a wrapper signs `(seq, file, name)` with the key (keyed BLAKE2) only after the real body
  returned. A test the runner calls passed must have a proof; a missing one, a record whose signature does
  not verify, or a replayed sequence number is tampering.
* **Canaries.** Each test file also gets a test with a random name that always fails. A runner that reports it
  passed is tampering.

Any disagreement is the flag `runner_tampered` (the caller then gives no test credit). What it cannot see: a
solution that makes the real test body return (an object equal to everything, patched assertion helpers)
— the static checks in envs/integrity.py flag those constructs; docs/environments.md lists what the red-team
suite (tests/redteam/) shows.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.envs import guard_site
from flywheel.tasks.loaders import node_parts

GUARD_PREFIX = ".fwguard-"


@dataclass
class Armed:
    """What `arm` planted: the key to verify proofs, where they land, which functions must prove themselves."""

    key: bytes
    nonce: str
    dirname: str  # the guard directory, relative to the tree root
    wrapped: dict[str, set[str]] = field(default_factory=dict)  # test file -> names of the wrapped test functions
    canaries: dict[str, str] = field(default_factory=dict)  # test file -> canary test name

    def pythonpath(self, inner_root: str) -> str:
        """PYTHONPATH for the test command, where `inner_root` is the tree's path as the sandbox sees it."""
        return f"{inner_root.rstrip('/')}/{self.dirname}"


@dataclass
class Verdict:
    report: dict[tuple[str, str], str]
    tampered: list[str]
    num_proofs: int = 0
    always_equal: bool = False  # a value from the workspace's code compared equal to a fresh private value


def test_functions(source: str) -> set[str]:
    """Names of the `test*` functions a test file defines at module level or in its classes (any depth)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    return names


_EQUALITY_METHODS = {"assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
                     "assertSetEqual", "assertSequenceEqual", "assertCountEqual", "assertMultiLineEqual"}


class _Probes(ast.NodeTransformer):
    """`assert a == b` -> `assert M.probe(a) == M.probe(b)`; `self.assertEqual(a, b)` likewise (first two
    arguments). `probe` returns its argument unchanged, so the test means what it meant."""

    def __init__(self, module: str) -> None:
        self.module = module

    def _probe(self, node: ast.expr) -> ast.expr:
        return ast.Call(ast.Attribute(ast.Name(self.module, ast.Load()), "probe", ast.Load()), [node], [])

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        t = node.test
        if isinstance(t, ast.Compare) and any(isinstance(op, ast.Eq) for op in t.ops):
            t.left = self._probe(t.left)
            t.comparators = [self._probe(c) for c in t.comparators]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in _EQUALITY_METHODS:
            node.args = [self._probe(a) if i < 2 else a for i, a in enumerate(node.args)]
        return node


def probed(source: str, module: str) -> str:
    """A test file's source with `import <module>` after its `__future__` imports and equality asserts probed
    for always-equal objects (see `_Probes`); the source as it is when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return f"import {module}\n" + source if not source.lstrip().startswith("from __future__") else source
    tree = _Probes(module).visit(tree)
    body = tree.body
    at = 0
    while at < len(body) and (isinstance(body[at], ast.ImportFrom) and body[at].module == "__future__"
                              or at == 0 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                              and isinstance(body[0].value.value, str)):
        at += 1
    body.insert(at, ast.Import([ast.alias(module)]))
    return ast.unparse(ast.fix_missing_locations(tree))


def arm(root: Path, test_files: list[str]) -> Armed:
    """Plant the guard in the restored tree `root` and append the wrap line and a canary to each test file.
    Files that are not there (a test id whose file the task does not have) are left alone."""
    nonce = secrets.token_hex(8)
    armed = Armed(key=secrets.token_bytes(32), nonce=nonce, dirname=f"{GUARD_PREFIX}{nonce}")
    module = f"_fwguard_{nonce}"
    gdir = root / armed.dirname
    gdir.mkdir(mode=0o777)
    os.chmod(gdir, 0o777)  # the sandboxed uid deletes the key file and writes proofs here
    site = gdir / "sitecustomize.py"
    site.write_text(Path(guard_site.__file__).read_text(encoding="utf-8"), encoding="utf-8")
    config = gdir / "guard.txt"
    config.write_text(f"{armed.key.hex()}\n{nonce}\n{module}\n", encoding="utf-8")
    for p in (site, config):
        os.chmod(p, 0o666)
    for rel in dict.fromkeys(test_files):
        path = root / rel
        if not path.is_file() or path.is_symlink() or not rel.endswith(".py"):
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        canary = f"test_{secrets.token_hex(6)}"
        armed.wrapped[rel] = test_functions(source)
        armed.canaries[rel] = canary
        tail = (f"\n\n{module}.wrap(globals(), {rel!r})\n\n\n"
                f"def {canary}():\n    raise AssertionError({('grading canary ' + nonce)!r})\n")
        path.write_text(probed(source, module).rstrip("\n") + "\n" + tail, encoding="utf-8")
    return armed


def read_proofs(armed: Armed, root: Path) -> tuple[dict[tuple[str, str], int], bool, list[str]]:
    """(valid proofs per (file, name), alive seen, problems) from the proof file under `root`."""
    counts: dict[tuple[str, str], int] = {}
    alive, problems, seen = False, list[str](), set[str]()
    path = root / armed.dirname / "proofs"
    if not path.is_file() or path.is_symlink():
        return counts, alive, problems
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            problems.append("a malformed proof record")
            continue
        seq, file, name, sig = parts
        want = hashlib.blake2b(f"{armed.nonce}\0{seq}\0{file}\0{name}".encode(), key=armed.key,
                               digest_size=32).hexdigest()
        if not hmac.compare_digest(want, sig):
            problems.append("a proof record with a bad signature")
            continue
        if seq in seen:
            problems.append("a replayed proof record")
            continue
        seen.add(seq)
        if name in ("<alive>", "<always-equal>") and not file:
            counts[("", name)] = counts.get(("", name), 0) + 1
            alive |= name == "<alive>"
        else:
            counts[(file, name)] = counts.get((file, name), 0) + 1
    return counts, alive, problems


def _function_of(test_id: str) -> tuple[str, str]:
    """`tests/test_x.py::TestA::test_b[1]` -> ("tests/test_x.py", "test_b")."""
    path, _, name = node_parts(test_id)
    return path, name.split("[", 1)[0]


def check(armed: Armed, root: Path, report: dict[tuple[str, str], str], test_ids: list[str],
          junit_key) -> Verdict:
    """Reconcile the runner's report with the proofs and canaries; `junit_key(test_id) -> (classname, name)`."""
    counts, alive, problems = read_proofs(armed, root)
    tampered = list(dict.fromkeys(problems))
    out = dict(report)
    passed_report = any(s == "passed" for s in report.values())
    if passed_report and not alive:
        tampered.append("tests reported passed, but the test process never started the grading guard")
    for rel, canary in armed.canaries.items():
        module = rel.removesuffix(".py").replace("/", ".")
        if report.get((module, canary)) == "passed":
            tampered.append(f"the canary test {rel}::{canary} (it always fails) was reported passed")
    needed: dict[tuple[str, str], int] = {}
    for tid in test_ids:
        fn = _function_of(tid)
        if report.get(junit_key(tid)) == "passed" and fn[1] in armed.wrapped.get(fn[0], ()):
            needed[fn] = needed.get(fn, 0) + 1
    for fn, n in needed.items():
        if counts.get(fn, 0) < n:
            tampered.append(f"{fn[0]}::{fn[1]} was reported passed {n} time(s) with {counts.get(fn, 0)} proof(s) "
                            "of a completed test body")
            for tid in test_ids:
                if _function_of(tid) == fn and out.get(junit_key(tid)) == "passed":
                    out[junit_key(tid)] = "failed"
    return Verdict(report=out, tampered=tampered, num_proofs=sum(counts.values()),
                   always_equal=counts.get(("", "<always-equal>"), 0) > 0)
