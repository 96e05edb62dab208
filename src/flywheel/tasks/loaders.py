"""Task files: flywheel JSONL, SWE-bench-style instances and HumanEval-style problems, loaded as `Task`s.

    load = load_tasks("tasks.jsonl")                       # fmt="auto" detects each line's format
    load = load_tasks("swe.jsonl", fmt="swebench", repos_dir="clones/")
    for err in load.errors: print(err)                     # broken tasks, by id and line; never raised
    base = task_base_dir(load.tasks[0], cache_dir)          # the workspace, materialised once per task

Why: a long run must never die of one bad line, so every line is parsed and checked on its own; a broken
task (bad JSON, a missing field, a missing repository or commit, a test file that is not there, a test
command whose program does not exist) becomes a `TaskLoadError` naming the task id and the line, and is
skipped. Only a task file that does not exist at all raises (ValueError): that is a config mistake.

Formats:
* flywheel: one `dataclasses.asdict(Task)` per line (what `save_tasks` writes).
* swebench: `instance_id, repo, base_commit, patch, test_patch, problem_statement, FAIL_TO_PASS,
  PASS_TO_PASS` (the two lists may be JSON-encoded strings, as on the Hugging Face hub). The repository is a
  local clone under `repos_dir` (`owner__name`, `owner/name` or `name`). `test_patch` is applied only at
  grading; `patch` (the reference fix) is kept in `meta["patch"]`.
* humaneval: `task_id, prompt, canonical_solution, test, entry_point`: a single-file task, `solution.py`
  holds the prompt and the agent completes it. Graded by data: `calls` where `check` is plain asserts on
  calls, else `check` as a program (the prompt, then the test) that the grader runs in a sandbox of its own,
  calling the candidate over pipes (envs/checks.py). The hidden test file (`check(entry_point)` in a namespace
  holding every name `solution.py` defines, as the official harness runs prompt, completion and test as one
  program) under the standard-library runner (`runtests.py`, tasks/minitest.py) is what the agent's own runs
  and the undefended baseline of `flywheel bench redteam` use.

A test command that runs `python -m MODULE` must find MODULE in this Python (the one the sandbox runs):
`python -m pytest` without pytest installed is a broken task, never a silent reward of 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from flywheel.config import UserError
from flywheel.sandbox.services import parse_services
from flywheel.sandbox.workspace import base_permissions, materialize_base
from flywheel.tasks import minitest
from flywheel.tasks.datatests import check_call, check_program, humaneval_calls, humaneval_check
from flywheel.tasks.repoenv import check_spec, spec_from_reader
from flywheel.tasks.variants import normalize
from flywheel.types import Task, TaskLimits

FORMATS = ("auto", "flywheel", "swebench", "humaneval")
TEST_FILE_NAMES = ("conftest.py",)
_ID_RX = re.compile(r'"(id|instance_id|task_id)"\s*:\s*"([^"\\]{1,200})"')


@dataclass
class TaskLoadError:
    task_id: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"task {self.task_id!r} (line {self.line}): {self.reason}"


@dataclass
class TaskLoad:
    tasks: list[Task] = field(default_factory=list)
    errors: list[TaskLoadError] = field(default_factory=list)

    def broken_summary(self, shown: int = 3) -> str:
        """The first broken lines, `line N (id): reason; ...`, and how many more there are."""
        first = "; ".join(f"line {e.line} ({e.task_id or '?'}): {e.reason}" for e in self.errors[:shown])
        return first + (f" and {len(self.errors) - shown} more" if len(self.errors) > shown else "")

    def refuse_broken(self, path: str | Path, use: str) -> None:
        """A UserError when the file has broken lines: the command would `use` only part of what the user meant
        (`use`: "evaluate", "serve"); --skip-broken is the way to say that is fine."""
        if self.errors:
            raise UserError(f"{len(self.errors)} broken task(s) in '{path}': {self.broken_summary()}. Fix them "
                            f"(`flywheel tasks check {path}` explains each), or pass --skip-broken to {use} the "
                            f"{len(self.tasks)} usable ones")


class BrokenTask(ValueError):
    """One task cannot be used; the loader records it and goes on."""


def is_test_path(path: str) -> bool:
    """pytest's default discovery: `test_*.py`, `*_test.py`, and `conftest.py`, anywhere."""
    name = PurePosixPath(path).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py") or name in TEST_FILE_NAMES)


def file_of_test(test_id: str) -> str:
    """`tests/test_x.py::TestA::test_b[1]` -> `tests/test_x.py`."""
    return test_id.split("::", 1)[0]


def node_parts(test_id: str) -> tuple[str, list[str], str]:
    """A pytest node id -> (file, classes, name with its parameters): `t/test_u.py::TestA::test_b[x]` ->
    ("t/test_u.py", ["TestA"], "test_b[x]"). The parameter id may itself hold `::` (an IPv6 URL in
    `test_url[https://[::1]:80/]`), so it is split off at the first `[` before the rest is split on `::`."""
    head, bracket, params = test_id.partition("[")
    path, *rest = head.split("::")
    if not rest:  # a bare file, or a file name that holds "["
        return test_id, [], ""
    return path, rest[:-1], rest[-1] + bracket + params


TEST_DIR_NAMES = frozenset({"tests", "test", "testing"})


def support_dirs_of(test_files: list[str]) -> set[str]:
    """The directories whose every file belongs to the tests: for each test file, its path down to the outermost
    directory named `tests`, `test` or `testing` (`pkg/tests/unit/test_x.py` -> `pkg/tests`). What lies there
    besides test files (helpers the tests import, `__init__.py`, data files they read) decides a verdict as much
    as a test does, so grading restores it and editing it is `tests_edited`. A test file at the top of the tree
    or beside the library's modules has none: there the test files alone are the tests."""
    out: set[str] = set()
    for f in test_files:
        parts = PurePosixPath(f).parts[:-1]
        for i, part in enumerate(parts):
            if part in TEST_DIR_NAMES:
                out.add(str(PurePosixPath(*parts[: i + 1])))
                break
    return out


def in_dirs(path: str, dirs: set[str]) -> bool:
    """Whether `path` lies under one of `dirs` (relative POSIX paths)."""
    return any(path.startswith(d + "/") for d in dirs)


# ---------------------------------------------------------------------------------------------
# Parsing one record


def _str(d: dict[str, Any], key: str, *, required: bool = True, default: str = "") -> str:
    v = d.get(key, None)
    if v is None:
        if required:
            raise BrokenTask(f"missing field '{key}'")
        return default
    if not isinstance(v, str):
        raise BrokenTask(f"field '{key}' must be a string, got {type(v).__name__}")
    return v


def _str_list(d: dict[str, Any], key: str) -> list[str]:
    v = d.get(key, [])
    if isinstance(v, str):  # SWE-bench on the hub stores lists as JSON text
        try:
            v = json.loads(v) if v.strip() else []
        except json.JSONDecodeError:
            raise BrokenTask(f"field '{key}' is a string that is not a JSON list") from None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise BrokenTask(f"field '{key}' must be a list of strings")
    return v


def _str_dict(d: dict[str, Any], key: str) -> dict[str, str]:
    v = d.get(key) or {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise BrokenTask(f"field '{key}' must map file paths to file contents (strings)")
    for path in v:
        p = PurePosixPath(path)
        if p.is_absolute() or ".." in p.parts or not path:
            raise BrokenTask(f"file path {path!r} in '{key}' must be relative and stay inside the workspace")
    return v


def _check_command(command: str, own_python: bool = True) -> None:
    """`own_python=False`: the task runs in its own environment (tasks/repoenv.py), which `flywheel tasks check`
    checks instead of this Python."""
    try:
        argv = shlex.split(command)
    except ValueError as err:
        raise BrokenTask(f"test_command {command!r} cannot be parsed: {err}") from None
    if not argv:
        raise BrokenTask("test_command is empty")
    prog = argv[0]
    if "=" in prog and not prog.startswith(("/", ".")):  # `ENV=1 pytest`: check the program after
        rest = [a for a in argv if "=" not in a]
        prog = rest[0] if rest else prog
    if prog in ("python", "python3"):
        rest = argv[argv.index(prog) + 1:]
        if own_python and len(rest) >= 2 and rest[0] == "-m" and importlib.util.find_spec(rest[1].split(".")[0]) is None:
            raise BrokenTask(f"test_command {command!r} runs the module {rest[1]!r}, which this Python "
                             f"({sys.executable}) cannot import: install it (for pytest: `pip install pytest`, or "
                             "flywheel's `dev` extra) or give the task a test_command that is installed")
        return
    if prog.startswith(("./", "../")):
        return
    if shutil.which(prog) is None:
        raise BrokenTask(f"test_command program {prog!r} is not installed (not on PATH)")


def _git(repo: Path, *args: str, data: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120, text=not data, check=False)


def _find_repo(repo: str, repos_dir: str | Path | None) -> Path:
    if repos_dir is None:
        p = Path(repo)
        if p.is_dir():
            return p
        if p.is_absolute():
            raise BrokenTask(f"repository directory {repo} does not exist (for mined tasks: keep `--cache-dir`)")
        raise BrokenTask(f"repository {repo!r} needs `repos_dir` (a directory of local clones)")
    root = Path(repos_dir)
    for cand in (root / repo.replace("/", "__"), root / repo, root / repo.split("/")[-1]):
        if (cand / ".git").exists():
            return cand
    raise BrokenTask(f"no local clone of {repo!r} under {root} (tried owner__name, owner/name and name)")


def _check_commit(repo: Path, commit: str) -> None:
    r = _git(repo, "cat-file", "-e", f"{commit}^{{commit}}")
    if r.returncode != 0:
        raise BrokenTask(f"commit {commit!r} is not in the repository {repo}")


def parse_flywheel(d: dict[str, Any], repos_dir: str | Path | None = None) -> Task:
    limits = d.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"max_turns", "timeout_s"}:
        raise BrokenTask("field 'limits' must be an object with 'max_turns' and/or 'timeout_s'")
    turns, timeout = limits.get("max_turns"), limits.get("timeout_s")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise BrokenTask(f"limits.max_turns must be a positive integer or null, got {turns!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BrokenTask(f"limits.timeout_s must be a positive number of seconds or null, got {timeout!r}")
    meta = d.get("meta") or {}
    if not isinstance(meta, dict):
        raise BrokenTask("field 'meta' must be an object")
    unknown = set(d) - {f.name for f in dataclasses.fields(Task)}
    if unknown:
        raise BrokenTask(f"unknown fields {sorted(unknown)}; allowed: {[f.name for f in dataclasses.fields(Task)]}")
    solution = d.get("solution")
    python_env = d.get("python_env")
    if python_env is not None:
        try:
            check_spec(python_env)
        except ValueError as err:
            raise BrokenTask(str(err)) from None
    task = Task(
        id=_str(d, "id"), problem=_str(d, "problem"), files=_str_dict(d, "files"),
        repo=_str(d, "repo", required=False) or None, commit=_str(d, "commit", required=False) or None,
        visible_tests=_str_list(d, "visible_tests"), hidden_files=_str_dict(d, "hidden_files"),
        test_patch=_str(d, "test_patch", required=False) or None, fail_to_pass=_str_list(d, "fail_to_pass"),
        pass_to_pass=_str_list(d, "pass_to_pass"), test_command=_str(d, "test_command", required=False,
                                                                      default="python -m pytest -q"),
        limits=TaskLimits(**limits), solution=_str_dict(d, "solution") if solution is not None else None, meta=meta,
        services=_services(d), python_env=python_env, calls=_calls(d), check=_check(d))
    if task.repo is not None:
        path = _find_repo(task.repo, repos_dir)
        task.repo = str(path.resolve())
        if task.commit is None:
            raise BrokenTask("a task with 'repo' needs 'commit'")
        _check_commit(path, task.commit)
    _check_task(task)
    return task


def _calls(d: dict[str, Any]) -> list[dict[str, Any]]:
    calls = d.get("calls") or []
    if not isinstance(calls, list):
        raise BrokenTask("field 'calls' must be a list of call objects (tasks/datatests.py)")
    for entry in calls:
        problem = check_call(entry)
        if problem is not None:
            raise BrokenTask(problem)
    graded = set(d.get("fail_to_pass") or []) | set(d.get("pass_to_pass") or [])
    missing = graded - {c["id"] for c in calls} if calls else set()
    if missing:
        raise BrokenTask(f"a task with 'calls' grades by them alone, but tests {sorted(missing)[:3]} have no call")
    return calls


def _check(d: dict[str, Any]) -> dict[str, str] | None:
    spec = d.get("check")
    if spec is None:
        return None
    problem = check_program(spec)
    if problem is not None:
        raise BrokenTask(problem)
    if d.get("calls"):
        raise BrokenTask("a task grades by 'calls' or by 'check', not both: drop one")
    graded = set(d.get("fail_to_pass") or []) | set(d.get("pass_to_pass") or [])
    if graded != {spec["id"]}:
        raise BrokenTask(f"a task with 'check' grades by it alone: its tests must be exactly [{spec['id']!r}] "
                         f"(got {sorted(graded)[:3]})")
    return dict(spec)


def _services(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's service declarations, checked (`sandbox/services.py`: kinds, keys, a PostgreSQL installed)."""
    items = d.get("services") or []
    try:
        parse_services(items)
    except ValueError as err:
        raise BrokenTask(f"field 'services': {err}") from None
    return list(items)


def _check_task(task: Task) -> None:
    if not task.id:
        raise BrokenTask("empty task id")
    if not task.files and task.repo is None:
        raise BrokenTask("task has neither 'files' nor 'repo'")
    _check_command(task.test_command, own_python=task.python_env is None)
    if not task.fail_to_pass and not task.pass_to_pass:
        raise BrokenTask("task has no hidden tests (fail_to_pass and pass_to_pass are both empty)")
    if task.repo is None:  # files-based: every named test file must exist somewhere in the task
        known = set(task.files) | set(task.hidden_files)
        for tid in task.visible_tests:
            if file_of_test(tid) not in task.files:
                raise BrokenTask(f"visible test file {file_of_test(tid)!r} is not among the task's files")
        for tid in task.fail_to_pass + task.pass_to_pass:
            if file_of_test(tid) not in known and not (task.test_patch and file_of_test(tid) in task.test_patch):
                raise BrokenTask(f"hidden test {tid!r}: file {file_of_test(tid)!r} is in neither 'files' "
                                 "nor 'hidden_files' nor 'test_patch'")


def parse_swebench(d: dict[str, Any], repos_dir: str | Path | None) -> Task:
    """A record of the SWE-bench family (SWE-bench, SWE-Gym, SWE-smith, R2E-Gym; tasks/variants.py).

    The task gets its own environment (`python_env`, from the repository's metadata at `environment_setup_commit`,
    else at the base commit) when the record has `environment_setup_commit` or `"python_env": "repo"`; otherwise
    the run's Python runs the tests, as before."""
    try:
        d = normalize(d)
    except (ValueError, KeyError) as err:
        raise BrokenTask(str(err)) from None
    iid = _str(d, "instance_id")
    repo = _find_repo(_str(d, "repo"), repos_dir)
    commit = _str(d, "base_commit")
    _check_commit(repo, commit)
    f2p, p2p = _str_list(d, "FAIL_TO_PASS"), _str_list(d, "PASS_TO_PASS")
    meta = {"format": "swebench", "variant": d.get("variant", "swebench"), "repo": d["repo"],
            "patch": _str(d, "patch", required=False)}
    for key in ("bug_patch", "fix_commit", "version", "image_name", "docker_image"):
        if isinstance(d.get(key), str):
            meta[key] = d[key]
    python_env = None
    env_commit = d.get("environment_setup_commit")
    if env_commit is not None or d.get("python_env") == "repo":
        at = str(env_commit or commit)
        _check_commit(repo, at)

        def read(path: str) -> str | None:
            r = _git(repo, "show", f"{at}:{path}", data=True)
            return r.stdout.decode("utf-8", errors="replace") if r.returncode == 0 else None

        try:
            python_env = spec_from_reader(read, name=str(d["repo"]))
        except ValueError as err:
            raise BrokenTask(f"environment of {d['repo']}@{at[:12]}: {err}") from None
    elif d.get("python_env") is not None:
        raise BrokenTask("field 'python_env' of a SWE-bench record may only be \"repo\" (derive it from the "
                         "repository's metadata)")
    task = Task(id=iid, problem=_str(d, "problem_statement"), repo=str(repo.resolve()), commit=commit,
                test_patch=_str(d, "test_patch", required=False) or None, fail_to_pass=f2p, pass_to_pass=p2p,
                test_command=_str(d, "test_command", required=False, default="python -m pytest -q"),
                meta=meta, python_env=python_env)
    _check_task(task)
    return task


def parse_humaneval(d: dict[str, Any]) -> Task:
    tid = _str(d, "task_id")
    prompt, test, entry = _str(d, "prompt"), _str(d, "test"), _str(d, "entry_point")
    canonical = _str(d, "canonical_solution", required=False)
    if not entry.isidentifier():
        raise BrokenTask(f"entry_point {entry!r} is not a Python identifier")
    if "def check" not in test:
        raise BrokenTask("field 'test' must define `check(candidate)`")
    hidden = (f"import solution as _solution\n\n# the names the prompt defines or imports, as in the official harness\n"
              f"globals().update({{k: v for k, v in vars(_solution).items() if not k.startswith('__')}})\n\n"
              f"{test}\n\n\ndef test_check():\n    check({entry})\n")
    runner = runner_source()
    test_id = "test_solution.py::test_check"
    calls = humaneval_calls(test, "solution", entry, test_id)
    task = Task(
        id=tid, files={"solution.py": prompt, RUNNER_FILE: runner},
        hidden_files={"test_solution.py": hidden, RUNNER_FILE: runner},
        problem=f"Complete the function `{entry}` in `solution.py` so that it does what its docstring says.",
        fail_to_pass=[test_id], test_command=f"python {RUNNER_FILE} -q",
        solution={"solution.py": prompt + canonical} if canonical else None,
        meta={"format": "humaneval", "entry_point": entry},
        calls=calls or [], check=None if calls else humaneval_check(prompt, test, "solution", entry, test_id))
    _check_task(task)
    return task


RUNNER_FILE = "runtests.py"


def runner_source() -> str:
    """The standard-library test runner (tasks/minitest.py) that tasks ship as `runtests.py`."""
    return Path(minitest.__file__).read_text(encoding="utf-8")


def detect_format(d: dict[str, Any]) -> str:
    if "instance_id" in d or ("repo_name" in d and "commit_hash" in d):
        return "swebench"
    if "entry_point" in d and "task_id" in d:
        return "humaneval"
    return "flywheel"


# ---------------------------------------------------------------------------------------------
# Files


def load_tasks(path: str | Path, fmt: str = "auto", repos_dir: str | Path | None = None) -> TaskLoad:
    """Every usable task in a JSONL file; broken lines are reported in `.errors` and skipped."""
    if fmt not in FORMATS:
        raise ValueError(f"task format must be one of {FORMATS}, got {fmt!r}")
    p = Path(path)
    if not p.is_file():
        raise UserError(f"task file '{p}' does not exist" if not p.exists() else f"task file '{p}' is a directory, "
                        f"not a JSONL file")
    load = TaskLoad()
    seen: set[str] = set()
    with p.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            m = _ID_RX.search(raw)  # best effort, so that even a line of bad JSON is reported by its id
            task_id = m.group(2) if m else f"<line {lineno}>"
            try:
                d = json.loads(raw)
                if not isinstance(d, dict):
                    raise BrokenTask(f"a task line must be a JSON object, got {type(d).__name__}")
                for key in ("id", "instance_id", "task_id"):
                    if isinstance(d.get(key), str):
                        task_id = d[key]
                        break
                kind = detect_format(d) if fmt == "auto" else fmt
                if kind == "swebench":
                    task = parse_swebench(d, repos_dir)
                elif kind == "humaneval":
                    task = parse_humaneval(d)
                else:
                    task = parse_flywheel(d, repos_dir)
                if task.id in seen:
                    raise BrokenTask("duplicate task id (the first one is kept)")
                seen.add(task.id)
                load.tasks.append(task)
            except json.JSONDecodeError as err:
                load.errors.append(TaskLoadError(task_id, lineno, f"bad JSON: {err}"))
            except (BrokenTask, TypeError) as err:
                load.errors.append(TaskLoadError(task_id, lineno, str(err)))
            except (OSError, subprocess.SubprocessError) as err:
                load.errors.append(TaskLoadError(task_id, lineno, f"cannot check the task: {err}"))
    return load


def task_to_dict(task: Task) -> dict[str, Any]:
    return dataclasses.asdict(task)


def save_tasks(tasks: list[Task], path: str | Path) -> Path:
    """Write flywheel JSONL, atomically (a temp file renamed over `path`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for t in tasks:
            fh.write(json.dumps(task_to_dict(t), ensure_ascii=False) + "\n")
    os.replace(tmp, p)
    return p


# ---------------------------------------------------------------------------------------------
# Workspaces


def _task_key(task: Task) -> str:
    """Cache key: the id (made path-safe) plus a hash of what the workspace is made of."""
    h = hashlib.sha256(json.dumps([task.files, task.repo, task.commit], sort_keys=True).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task.id)[:80]
    return f"{safe}-{h}"


def write_files(root: Path, files: dict[str, str]) -> None:
    root = root.resolve()
    for rel, content in files.items():
        dest = (root / rel).resolve()
        if root not in dest.parents:
            raise ValueError(f"file path {rel!r} leaves the workspace")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content, encoding="utf-8")


def export_commit(repo: str | Path, commit: str, dest: Path) -> None:
    """The tree of `repo@commit` written into `dest` (no .git), via `git archive`."""
    r = _git(Path(repo), "archive", "--format=tar", commit, data=True)
    if r.returncode != 0:
        raise ValueError(f"git archive {commit} in {repo} failed: {r.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(dest, filter="data")


def task_base_dir(task: Task, cache_dir: str | Path) -> Path:
    """The task's initial workspace, materialised once under `cache_dir` and reused (read it, never write it)."""
    cache = Path(cache_dir)
    final = cache / _task_key(task)
    if final.is_dir():  # complete: it only appears by an atomic rename
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        if task.repo is not None:
            if task.commit is None:
                raise ValueError(f"task {task.id!r} names a repo but no commit")
            export_commit(task.repo, task.commit, tmp)
            write_files(tmp, task.files)
            base_permissions(tmp)
        else:
            materialize_base(task.files, tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another worker won the race; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def original_file(task: Task, path: str) -> str | None:
    """A workspace file as the task starts it (None when the task has no such file)."""
    if path in task.files:
        return task.files[path]
    data = original_bytes(task, path)
    return None if data is None else data.decode("utf-8", errors="replace")


def original_bytes(task: Task, path: str) -> bytes | None:
    """`original_file` as bytes (a test's data file need not be text)."""
    if path in task.files:
        return task.files[path].encode("utf-8")
    if task.repo is not None and task.commit is not None:
        r = _git(Path(task.repo), "show", f"{task.commit}:{path}", data=True)
        if r.returncode == 0:
            return r.stdout
    return None


def original_paths(task: Task) -> list[str]:
    """Every file path of the task's initial workspace."""
    paths = set(task.files)
    if task.repo is not None and task.commit is not None:
        r = _git(Path(task.repo), "ls-tree", "-r", "--name-only", task.commit)
        if r.returncode == 0:
            paths |= set(r.stdout.split("\n")) - {""}
    return sorted(paths)
