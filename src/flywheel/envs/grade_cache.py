"""Hidden-test results kept per process and reused when a restored workspace is byte-identical to one graded.

    key = result_key(task, command, kind, root)   # None: the tree holds something it cannot hash
    cached = GRADE_CACHE.get(key)                 # (components, report) or None
    GRADE_CACHE.put(key, (components, report), capacity)

Why: the sessions of a GRPO group work on the same task and often end in the same tree — the same one-line
fix, or no change at all — and grading is the largest sandbox cost of a session (a bubblewrap start and a
Python test run, ~60 ms of CPU here). On two cores that CPU is taken from the trainer in async mode.

What the key covers: the task id, the exact test command, the sandbox kind, and every entry of the restored
tree (the agent's final workspace after the test files are restored and the hidden files written; see
reward.grade): relative path, kind (file, symlink, directory), the executable bit, and the bytes or link
target. Equal keys therefore mean the tests see the same files. The result of a run that timed out is not kept
(it may pass with a less busy machine). The cache assumes the hidden tests are deterministic for a given tree;
`env.grade_cache = 0` turns it off for suites that are not.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from flywheel.types import Task


def tree_digest(root: Path) -> str | None:
    """sha256 over (path, kind, exec bit, content) of every entry under `root`, in sorted order; None when an
    entry is neither a file, a symlink nor a directory (a FIFO, a socket: nothing to key on)."""
    h = hashlib.sha256()
    entries: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            entries.append((os.path.relpath(full, root), full))
    for rel, full in sorted(entries):
        mode = os.lstat(full).st_mode
        if stat.S_ISLNK(mode):
            kind, data = b"l", os.readlink(full).encode("utf-8", "surrogateescape")
        elif stat.S_ISDIR(mode):
            kind, data = b"d", b""
        elif stat.S_ISREG(mode):
            kind = b"x" if mode & stat.S_IXUSR else b"f"
            with open(full, "rb") as f:
                data = f.read()
        else:
            return None
        key = rel.encode("utf-8", "surrogateescape")
        h.update(b"%d:%s%s%d:" % (len(key), key, kind, len(data)))
        h.update(data)
    return h.hexdigest()


def result_key(task: Task, command: str, kind: str, root: Path) -> str | None:
    """The cache key of grading `root` with `command` in a sandbox of `kind`; None when the tree cannot be hashed."""
    digest = tree_digest(root)
    if digest is None:
        return None
    return hashlib.sha256("\0".join((task.id, command, kind, digest)).encode()).hexdigest()


class GradeCache:
    """A thread-safe LRU map, key -> (components, report). Values are copied on the way in and out."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[dict, dict]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str | None) -> tuple[dict[str, float], dict[Any, str]] | None:
        with self._lock:
            if key is None or key not in self._items:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            components, report = self._items[key]
            return dict(components), dict(report)

    def put(self, key: str | None, value: tuple[dict[str, float], dict[Any, str]], capacity: int) -> None:
        if key is None or capacity <= 0:
            return
        with self._lock:
            self._items[key] = (dict(value[0]), dict(value[1]))
            self._items.move_to_end(key)
            while len(self._items) > capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


GRADE_CACHE = GradeCache()  # per process: the engine node's rollout workers, or a Ray grader actor
