"""Real Python projects as local git repositories: source distributions from the package index, or a directory.

    src = fetch_sdist("inflection==0.5.1", cache_dir)      # pip download --no-binary :all: --no-deps, then unpacked
    project = import_project(src, cache_dir / "repos", "inflection-0.5.1")
    project.repo, project.commit, project.test_command

Why git: a mined task is the project's tree at a commit of its own (the original, then one commit per injected bug
on top of it, each kept alive by a ref `refs/flywheel/<task id>`), so hundreds of tasks of one project share its
objects, and the loader, the workspace cache and the grader read them the way they read any repository.
Versions are pinned (`NAME==VERSION`): the same command mines the same trees.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from flywheel.sandbox.bounded import run_bounded

_PIN_RX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+$")
GIT_ENV = {"GIT_AUTHOR_NAME": "flywheel", "GIT_AUTHOR_EMAIL": "flywheel@localhost", "GIT_COMMITTER_NAME": "flywheel",
           "GIT_COMMITTER_EMAIL": "flywheel@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
GIT_TIMEOUT_S = 120.0  # the default of mine.git_timeout_s


@dataclass
class Project:
    name: str  # e.g. inflection-0.5.1
    repo: str  # the local git repository (absolute path)
    commit: str  # the original tree
    test_command: str  # pytest-compatible, run from the repository root


def git(repo: str | Path, *args: str, input_text: str | None = None, env: dict[str, str] | None = None,
        timeout_s: float = GIT_TIMEOUT_S) -> str:
    """`git -C repo args...` stdout; ValueError with git's message when it fails or runs past `timeout_s`."""
    r = run_bounded(["git", "-C", str(repo), *args], input_text=input_text, timeout_s=timeout_s,
                    env={**os.environ, **GIT_ENV, **(env or {})})
    if r.timed_out:
        raise ValueError(f"git {' '.join(args[:2])} in {repo} took longer than {timeout_s:.0f} s (mine.git_timeout_s)")
    if r.returncode != 0:
        raise ValueError(f"git {' '.join(args[:2])} in {repo} failed: {r.stderr.strip()[:500]}")
    return r.stdout


def fetch_sdist(pin: str, cache_dir: str | Path, *, timeout_s: float = 600.0) -> Path:
    """The unpacked source distribution of `NAME==VERSION` (downloaded once into `cache_dir/sdists`); ValueError
    when it cannot be downloaded within `timeout_s` (mine.download_timeout_s)."""
    if not _PIN_RX.match(pin):
        raise ValueError(f"project {pin!r} must be pinned as NAME==VERSION (e.g. inflection==0.5.1)")
    cache = Path(cache_dir)
    name, version = pin.split("==")
    dest = cache / "src" / f"{name}-{version}"
    if dest.is_dir():
        return dest
    sdists = cache / "sdists" / f"{name}-{version}"
    sdists.mkdir(parents=True, exist_ok=True)
    if not any(sdists.iterdir()):
        r = run_bounded([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                         "--disable-pip-version-check", "-q", "-d", str(sdists), pin], timeout_s=timeout_s)
        if r.timed_out:
            shutil.rmtree(sdists, ignore_errors=True)  # a partial download must not count as the archive
            raise ValueError(f"cannot download the source distribution of {pin} within {timeout_s:.0f} s "
                             "(mine.download_timeout_s)")
        if r.returncode != 0 or not any(sdists.iterdir()):
            raise ValueError(f"cannot download the source distribution of {pin}: {(r.stdout + r.stderr)[-800:]}")
    archive = next(p for p in sdists.iterdir() if p.is_file())
    (cache / "src").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache / "src"))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
        tops = list(tmp.iterdir())
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
        os.rename(root, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def test_command_for(root: Path) -> str:
    """pytest from the repository root; `src/` layouts get it on sys.path (pytest's `pythonpath`), and the
    project's own `addopts` are dropped (they name plugins, such as coverage, that grading does not load)."""
    cmd = "python -m pytest -q -rfEsxXp --rootdir=. -o addopts="
    if (root / "src").is_dir() and not (root / "src" / "__init__.py").exists():
        cmd += " -o pythonpath=src"
    return cmd


def import_project(src: str | Path, repos_dir: str | Path, name: str, *, timeout_s: float = GIT_TIMEOUT_S) -> Project:
    """A git repository of the tree `src` (one commit), made once under `repos_dir/name` and reused."""
    repo = Path(repos_dir).resolve() / name
    if (repo / ".git").is_dir():
        try:
            commit = git(repo, "rev-parse", "refs/flywheel/original", timeout_s=timeout_s).strip()
            return Project(name, str(repo), commit, test_command_for(repo))
        except ValueError:
            shutil.rmtree(repo)  # half-made
    shutil.copytree(src, repo, ignore=shutil.ignore_patterns("*.pyc", "__pycache__", ".git", "*.egg-info"))
    git(repo, "init", "-q", timeout_s=timeout_s)
    git(repo, "add", "-A", "-f", timeout_s=timeout_s)
    git(repo, "commit", "-q", "-m", f"{name}: original source", timeout_s=timeout_s)
    commit = git(repo, "rev-parse", "HEAD", timeout_s=timeout_s).strip()
    git(repo, "update-ref", "refs/flywheel/original", commit, timeout_s=timeout_s)
    return Project(name, str(repo), commit, test_command_for(repo))


def commit_change(project: Project, path: str, text: str, ref: str, message: str, *,
                  timeout_s: float = GIT_TIMEOUT_S) -> str:
    """A commit on top of the original with `path` replaced by `text`, kept by `refs/flywheel/<ref>`; its sha.
    The work tree is not touched (a private index), so mining can go on in it."""
    blob = git(project.repo, "hash-object", "-w", "--stdin", input_text=text, timeout_s=timeout_s).strip()
    with tempfile.TemporaryDirectory(prefix="flywheel-index-") as d:
        env = {"GIT_INDEX_FILE": str(Path(d) / "index")}
        git(project.repo, "read-tree", project.commit, env=env, timeout_s=timeout_s)
        mode = git(project.repo, "ls-tree", project.commit, "--", path, timeout_s=timeout_s).split(" ", 1)[0] or "100644"
        git(project.repo, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env, timeout_s=timeout_s)
        tree = git(project.repo, "write-tree", env=env, timeout_s=timeout_s).strip()
    sha = git(project.repo, "commit-tree", tree, "-p", project.commit, "-m", message, timeout_s=timeout_s).strip()
    git(project.repo, "update-ref", f"refs/flywheel/{ref}", sha, timeout_s=timeout_s)
    return sha
