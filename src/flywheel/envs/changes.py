"""What an agent changed in its workspace, byte-exact, and grading from those changes anywhere.

    changes = capture_changes(task_base_dir(task, cache), Path(sandbox.workspace))   # where the session ran
    reward = RebuildGrader(cfg.env, cache_dir).grade(task, changes, tool_log)       # anywhere: same Reward
    env = CodingEnv(cfg.env, cache_dir, grader=some_grader)                          # CodingEnv.grade uses it

Why changes, not a directory: a task's base is rebuilt from the `Task` itself (its files, or its repo at its
commit) on any machine, so only what the agent changed has to cross the network — a few KB for a bug fix.
The capture is byte-exact and sees what `reward.grade` copies (regular files with their mode bits, symlinks with
their targets, directories, deletions; caches, `.pyc` files and FIFOs/devices are skipped exactly as grading
skips them), so `reward.grade` on the rebuilt directory returns the very Reward it returns on the agent's own
workspace (tests/unit/test_remote_grading.py checks value, components, tests and flags). `workspace_changes` in
reward.py stays what it is, a text view for flags and diffs. The Ray backend's grader actors
(orchestrator/grader.py, GraderPool) are built on this.
"""


from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flywheel.config import EnvConfig
from flywheel.envs.reward import (
    SKIP_DIRS,  # what reward.grade's copy leaves out: skipped here too
    grade,
)
from flywheel.sandbox.nofollow import inside, real_parents, remove_entry, write_inside
from flywheel.tasks.loaders import task_base_dir
from flywheel.types import Reward, Task


@dataclass
class Changes:
    """The agent's final workspace relative to the task's base, byte-exact. Picklable (it crosses processes)."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # added/modified: path -> (content, mode)
    links: dict[str, str] = field(default_factory=dict)  # added/changed symlinks: path -> target
    dirs: list[str] = field(default_factory=list)  # directories the base lacks (kept even when empty)
    deleted: list[str] = field(default_factory=list)  # base paths gone (or changed kind), parents first

    @property
    def num_bytes(self) -> int:
        return sum(len(c) for c, _ in self.files.values()) + sum(len(t) for t in self.links.values())


class Grader(Protocol):
    """Grades a session from its changes: `grade(task, changes, tool_log) -> Reward` (a plain callable works too)."""

    def grade(self, task: Task, changes: Changes, tool_log: list[dict]) -> Reward: ...


def _skipped(name: str) -> bool:
    return name in SKIP_DIRS or name.endswith(".pyc")


def _scan(root: Path) -> dict[str, tuple[str, Any]]:
    """rel path -> ("dir", None) | ("file", (st_mode, size)) | ("link", target): what copytree would copy."""
    out: dict[str, tuple[str, Any]] = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):  # never follows links
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for name in dirnames + filenames:
            if _skipped(name):
                continue
            p = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None)
                keep.append(name)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", (st.st_mode, st.st_size))
            # FIFOs, sockets, devices: grading skips them, so do we
        dirnames[:] = [d for d in dirnames if d in keep]
    return out


def capture_changes(base: Path, workspace: Path) -> Changes:
    """What `workspace` changed relative to `base` (the task's materialised initial workspace)."""
    base, workspace = Path(base), Path(workspace)
    before, after = _scan(base), _scan(workspace)
    ch = Changes()
    for rel, (kind, info) in sorted(after.items()):
        old = before.get(rel)
        if kind == "dir":
            if old is None or old[0] != "dir":
                ch.dirs.append(rel)
        elif kind == "link":
            if old != ("link", info):
                ch.links[rel] = info
        else:
            data = (workspace / rel).read_bytes()
            mode = stat.S_IMODE(info[0])
            if old is not None and old[0] == "file" and stat.S_IMODE(old[1][0]) == mode and old[1][1] == len(data) \
                    and (base / rel).read_bytes() == data:
                continue
            ch.files[rel] = (data, mode)
    for rel, (kind, _) in before.items():
        now = after.get(rel)
        if now is None or now[0] != kind:
            ch.deleted.append(rel)
    ch.deleted.sort(key=lambda p: (p.count(os.sep), p))  # parents first: a removed tree goes in one rmtree
    return ch


def apply_changes(root: Path, changes: Changes) -> None:
    """Turn a copy of the task's base at `root` into the agent's final workspace."""
    if not isinstance(changes, Changes):
        raise TypeError(f"changes must be a Changes (from capture_changes), got {type(changes).__name__}")
    root = Path(root)
    for rel in changes.deleted:
        p = inside(root, rel)
        if all(q.is_dir() and not q.is_symlink() for q in [p.parent, *p.parent.parents] if q != root and root in q.parents):
            remove_entry(p)  # (a path under an already removed tree is gone with it)
    for rel in changes.dirs:
        p = inside(root, rel)
        real_parents(root, rel)
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        p.mkdir(exist_ok=True)
    for rel, target in changes.links.items():
        p = inside(root, rel)
        real_parents(root, rel)
        remove_entry(p)
        os.symlink(target, p)
    for rel, (data, mode) in changes.files.items():
        write_inside(root, rel, data, mode)


class RebuildGrader:
    """Rebuild the workspace (task base + changes) in a private temp dir, then run the same `reward.grade`."""

    def __init__(self, cfg: EnvConfig, cache_dir: str | Path, kind: str = "auto") -> None:
        if not isinstance(cfg, EnvConfig):
            raise TypeError(f"cfg must be an EnvConfig, got {type(cfg).__name__}")
        self.cfg, self.cache_dir = cfg, Path(cache_dir)
        self.kind = kind if kind != "auto" else cfg.sandbox

    def grade(self, task: Task, changes: Changes, tool_log: list[dict]) -> Reward:
        base = task_base_dir(task, self.cache_dir)
        tmp = Path(tempfile.mkdtemp(prefix="flywheel-rebuild-"))
        try:
            ws = tmp / "ws"
            shutil.copytree(base, ws, symlinks=True)
            apply_changes(ws, changes)
            return grade(task, ws, self.cfg, tool_log=list(tool_log), kind=self.kind)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    __call__ = grade


def call_grader(grader: Any, task: Task, changes: Changes, tool_log: list[dict]) -> Reward:
    """A `Grader` object or a plain callable `(task, changes, tool_log) -> Reward`."""
    fn: Callable = grader.grade if hasattr(grader, "grade") else grader
    reward = fn(task, changes, tool_log)
    if not isinstance(reward, Reward):
        raise TypeError(f"the grader returned {type(reward).__name__}, not a Reward")
    return reward
