"""Per-repository Python environments: one virtual environment per distinct dependency spec, shared by every task.

    spec = spec_from_dir(Path("clone"), name="acme/mini")      # requirements from the project's own metadata
    build = build_env(spec, envs_dir)                          # envs_dir/<key>/ is the venv; cached by content
    path = ready_env(spec, envs_dir)                           # the venv, or EnvNotReady saying what to run
    flywheel envs build tasks.jsonl                            # every task's spec, each built once

Why: a repository's tests need its dependencies, and the run's own virtual environment cannot hold every
repository's (they conflict, and a policy must not see flywheel's). A task names its environment as data
(`Task.python_env`: the interpreter version and the requirement strings read from the project's pyproject.toml,
setup.cfg, setup.py and requirements files); the key is a hash of that spec, so every task of a repository, and
of any other repository with the same requirements, shares one venv. The sandbox binds the venv read-only
(`create_sandbox(..., python_env=path)`, at /env under bubblewrap) and puts its bin/ first on PATH, so the task's
`python -m pytest` runs with the repository's dependencies and never with flywheel's.

Building: `python -m venv --without-pip` (the run's own interpreter, so the sandbox already shows its base
installation), then the run's pip installs the requirements into it with `pip --python` from the package index
this machine reaches. A build is done under a lock (one builder per key, on one host), and `build.json` (install
seconds, disk bytes, the installed versions) is written last: a directory without it is half-built and rebuilt.
A failure writes `<key>.failed.json` with the tail of pip's output; every task on that spec is then a broken task
(`flywheel tasks check`) until `flywheel envs build --retry` succeeds. The project under test is *not* installed:
the tests import it from the workspace, which is what the agent edits.

What is read (decision): `[project] dependencies` and the optional-dependency groups `test`, `tests`, `testing`
(and PEP 735 `[dependency-groups]` of those names); setup.cfg's `install_requires`, `tests_require` and the same
extras; setup.py's literal `install_requires` / `tests_require` / `extras_require`; requirements files whose name
says runtime or test (`requirements.txt`, `requirements-test.txt`, `test-requirements.txt`, `requirements/test.txt`,
...). Poetry tables and dev/docs groups are not read. `pytest` (PYTEST_REQUIREMENT) is always added.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flywheel.sandbox.bounded import run_bounded

PYTEST_REQUIREMENT = "pytest==8.3.5"  # the runner every environment gets (pinned: the env key must mean one thing)
BUILD_VERSION = 1  # bump when the way environments are built changes: old keys then no longer match
DEFAULT_ENVS_DIR = "~/.cache/flywheel/envs"
TEST_EXTRAS = ("test", "tests", "testing")
REQUIREMENT_FILES = ("requirements.txt", "requirements-test.txt", "requirements_test.txt", "requirements-tests.txt",
                     "test-requirements.txt", "test_requirements.txt", "tests-requirements.txt",
                     "requirements/test.txt", "requirements/tests.txt", "requirements/testing.txt",
                     "requirements/base.txt", "tests/requirements.txt")
METADATA_FILES = ("pyproject.toml", "setup.cfg", "setup.py", *REQUIREMENT_FILES)
_NAME_RX = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class EnvNotReady(ValueError):
    """A task's environment is not built, or its build failed; the message says what to run or fix."""


@dataclass
class EnvBuild:
    """The outcome of `build_env`: `status` is "built", "cached" or "failed"."""

    key: str
    name: str
    path: str
    status: str
    install_s: float = 0.0
    disk_bytes: int = 0
    error: str = ""
    packages: list[str] | None = None


# ---------------------------------------------------------------------------------------------
# Specs: what an environment is made of


def python_version() -> str:
    """`3.11`: environments are built with the run's interpreter (the sandbox binds its installation)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def env_key(spec: dict[str, Any]) -> str:
    """The content address of a spec: its interpreter, requirements and the build version (not its name)."""
    core = {"python": spec.get("python"), "requirements": sorted(spec.get("requirements", [])), "v": BUILD_VERSION}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def check_spec(spec: Any) -> dict[str, Any]:
    """`spec` checked as a `Task.python_env` value; raises ValueError naming the field to fix."""
    if not isinstance(spec, dict) or set(spec) - {"python", "requirements", "name"}:
        raise ValueError("python_env must be an object with 'python', 'requirements' and optionally 'name'")
    reqs = spec.get("requirements")
    if not isinstance(reqs, list) or not all(isinstance(r, str) and r.strip() and "\n" not in r for r in reqs):
        raise ValueError("python_env.requirements must be a list of requirement strings (one per item)")
    if any(r.lstrip().startswith("-") for r in reqs):
        raise ValueError("python_env.requirements may not hold pip options (items starting with '-')")
    if spec.get("python") != python_version():
        raise ValueError(f"python_env.python is {spec.get('python')!r} but environments are built with this run's "
                         f"Python {python_version()}: run flywheel with that Python, or re-derive the spec")
    return spec


def _req_name(req: str) -> str:
    m = _NAME_RX.match(req)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""


def _requirement_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-", ".", "/")) or "://" in line:
            continue  # options, includes, local paths and URLs are not followed
        out.append(line)
    return out


def _from_pyproject(text: str) -> tuple[list[str], str]:
    data = tomllib.loads(text)
    project = data.get("project") or {}
    reqs = list(project.get("dependencies") or [])
    for group in TEST_EXTRAS:
        reqs += list((project.get("optional-dependencies") or {}).get(group) or [])
        reqs += [r for r in (data.get("dependency-groups") or {}).get(group) or [] if isinstance(r, str)]
    return reqs, str(project.get("name") or "")


def _from_setup_cfg(text: str) -> tuple[list[str], str]:
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(text)
    reqs: list[str] = []
    for key in ("install_requires", "tests_require"):
        reqs += _requirement_lines(cp.get("options", key, fallback=""))
    for group in TEST_EXTRAS:
        reqs += _requirement_lines(cp.get("options.extras_require", group, fallback=""))
    return reqs, cp.get("metadata", "name", fallback="")


def _from_setup_py(text: str) -> tuple[list[str], str]:
    """Literal arguments of `setup(...)` (names bound to literals at module level are followed)."""
    tree = ast.parse(text)
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError, TypeError, SyntaxError, RecursionError):
                consts[node.targets[0].id] = ast.literal_eval(node.value)

    def value(expr: ast.expr) -> Any:
        if isinstance(expr, ast.Name):
            return consts.get(expr.id)
        try:
            return ast.literal_eval(expr)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None

    reqs: list[str] = []
    name = ""
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "setup":
            for kw in call.keywords:
                v = value(kw.value)
                if kw.arg in ("install_requires", "tests_require") and isinstance(v, (list, tuple)):
                    reqs += [r for r in v if isinstance(r, str)]
                elif kw.arg == "extras_require" and isinstance(v, dict):
                    for group in TEST_EXTRAS:
                        g = v.get(group) or []
                        reqs += [r for r in g if isinstance(r, str)]
                elif kw.arg == "name" and isinstance(v, str):
                    name = v
    return reqs, name


def spec_from_reader(read: Callable[[str], str | None], name: str = "") -> dict[str, Any]:
    """The environment spec of a project whose files `read(path)` returns (None: no such file).

    Raises ValueError when a metadata file that exists cannot be parsed (a broken task, not a silent empty env)."""
    reqs: list[str] = []
    project = ""
    parsers: dict[str, Callable[[str], tuple[list[str], str]]] = {
        "pyproject.toml": _from_pyproject, "setup.cfg": _from_setup_cfg, "setup.py": _from_setup_py}
    for path in METADATA_FILES:
        text = read(path)
        if text is None:
            continue
        try:
            got, pname = parsers[path](text) if path in parsers else (_requirement_lines(text), "")
        except (ValueError, SyntaxError, configparser.Error) as err:
            raise ValueError(f"cannot read the dependencies in {path}: {err}") from None
        reqs += got
        project = project or pname
    own = _req_name(project) if project else ""
    keep: dict[str, None] = {}
    for r in reqs:
        r = " ".join(r.split())
        if r and _req_name(r) and _req_name(r) != own:  # the project itself comes from the workspace
            keep[r] = None
    if not any(_req_name(r) == "pytest" for r in keep):
        keep[PYTEST_REQUIREMENT] = None
    return {"name": name or project, "python": python_version(), "requirements": sorted(keep)}


def spec_from_dir(root: str | Path, name: str = "") -> dict[str, Any]:
    """`spec_from_reader` over a directory (an extracted source distribution, a checkout)."""
    base = Path(root)

    def read(path: str) -> str | None:
        p = base / path
        return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None

    return spec_from_reader(read, name)


# ---------------------------------------------------------------------------------------------
# Building


def envs_root(envs_dir: str | Path | None = None) -> Path:
    return Path(os.path.expanduser(str(envs_dir or DEFAULT_ENVS_DIR))).resolve()


def _paths(spec: dict[str, Any], envs_dir: str | Path | None) -> tuple[str, Path, Path, Path]:
    key = env_key(spec)
    root = envs_root(envs_dir)
    return key, root / key, root / f"{key}.failed.json", root / f"{key}.lock"


def _disk_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built(spec: dict[str, Any], envs_dir: str | Path | None = None) -> EnvBuild | None:
    """The finished build of `spec` (its build.json), or None."""
    key, path, _, _ = _paths(spec, envs_dir)
    record = path / "build.json"
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    return EnvBuild(key=key, name=str(spec.get("name", "")), path=str(path), status="cached",
                    install_s=float(data.get("install_s", 0.0)), disk_bytes=int(data.get("disk_bytes", 0)),
                    packages=data.get("packages"))


def build_env(spec: dict[str, Any], envs_dir: str | Path | None = None, *, retry: bool = False,
              timeout_s: float = 1800.0, memory_mb: int | None = 8192) -> EnvBuild:
    """Build the venv of `spec` unless it is built (status "cached") or failed before (unless `retry`).

    `timeout_s` bounds the pip install and `memory_mb` its address space (mine.install_timeout_s,
    mine.install_memory_mb); past either the build fails with the reason, and nothing of it keeps running
    (sandbox/bounded.py)."""
    check_spec(spec)
    key, path, failed, lock = _paths(spec, envs_dir)
    name = str(spec.get("name", ""))
    with _locked(lock):
        done = built(spec, envs_dir)
        if done is not None:
            return done
        if failed.is_file() and not retry:
            data = json.loads(failed.read_text())
            return EnvBuild(key=key, name=name, path=str(path), status="failed", install_s=data.get("install_s", 0.0),
                            error=str(data.get("error", "")))
        shutil.rmtree(path, ignore_errors=True)  # half-built by a killed builder
        t0 = time.perf_counter()
        error = ""
        try:
            r = run_bounded([sys.executable, "-m", "venv", "--without-pip", str(path)], timeout_s=300,
                            memory_mb=memory_mb)
            if r.returncode != 0:
                error = f"python -m venv failed: {(r.stdout + r.stderr)[-2000:]}"
            else:
                r = run_bounded([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install",
                                 "--no-input", "--disable-pip-version-check", "-q", *spec["requirements"]],
                                timeout_s=timeout_s, memory_mb=memory_mb)
                if r.timed_out:
                    error = f"the build took longer than {timeout_s:.0f} s (mine.install_timeout_s)"
                elif r.returncode != 0:
                    error = f"pip install failed (exit {r.returncode}): {(r.stdout + r.stderr)[-2000:].strip()}"
        except OSError as err:
            error = f"cannot run the build: {err}"
        install_s = time.perf_counter() - t0
        if error:
            shutil.rmtree(path, ignore_errors=True)
            failed.write_text(json.dumps({"key": key, "spec": spec, "error": error, "install_s": install_s}, indent=1))
            return EnvBuild(key=key, name=name, path=str(path), status="failed", install_s=install_s, error=error)
        r = run_bounded([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "list",
                         "--format=freeze", "--disable-pip-version-check"], timeout_s=120, memory_mb=memory_mb)
        packages = sorted(r.stdout.split()) if r.returncode == 0 else []
        disk = _disk_bytes(path)
        record = {"key": key, "spec": spec, "install_s": install_s, "disk_bytes": disk, "packages": packages,
                  "python": sys.version.split()[0]}
        tmp = path / "build.json.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path / "build.json")  # last: its presence means the venv is complete
        failed.unlink(missing_ok=True)
        return EnvBuild(key=key, name=name, path=str(path), status="built", install_s=install_s, disk_bytes=disk,
                        packages=packages)


def ready_env(spec: dict[str, Any], envs_dir: str | Path | None = None) -> Path:
    """The built venv of `spec`; EnvNotReady (a ValueError) naming the failure or the command to run."""
    try:
        check_spec(spec)
    except ValueError as err:
        raise EnvNotReady(str(err)) from None
    key, path, failed, _ = _paths(spec, envs_dir)
    if (path / "build.json").is_file():
        return path
    label = f"{spec.get('name') or 'environment'} ({key})"
    if failed.is_file():
        try:
            error = str(json.loads(failed.read_text()).get("error", ""))
        except (OSError, ValueError):
            error = "(no record)"
        raise EnvNotReady(f"the environment {label} failed to build: {error[-600:]} — fix the requirements, then "
                          "`flywheel envs build TASKS --retry`")
    raise EnvNotReady(f"the environment {label} is not built under {envs_root(envs_dir)}: run "
                      "`flywheel envs build TASKS`")


def env_problem(spec: dict[str, Any] | None, envs_dir: str | Path | None = None) -> str | None:
    """Why a task with this spec cannot run now (None: it can, or it needs no environment of its own)."""
    if spec is None:
        return None
    try:
        ready_env(spec, envs_dir)
    except EnvNotReady as err:
        return str(err)
    return None


def build_record(build: EnvBuild) -> dict[str, Any]:
    return {k: v for k, v in asdict(build).items() if k != "packages"}
