"""Writing into a directory tree someone else made, without ever following a link they planted.

    from flywheel.sandbox.nofollow import write_inside
    write_inside(root, "tests/test_hidden.py", text)            # str (UTF-8) or bytes; `mode=0o755` sets the bits

Why: grading runs as host root on a copy of the agent's final workspace: envs/reward.py restores the task's test
files and writes the hidden ones into it, envs/changes.py rebuilds a workspace from an agent's changes. The agent
made that tree, so any directory on the way may be a symlink to `/` or to another task's base, and the file itself
may be a link. Here every path must be relative and lexically inside `root`; every symlink or non-directory on the
way is replaced by a real directory; the file (or whatever stands at its name) is removed and created anew with
O_EXCL | O_NOFOLLOW, never opened through a link. Nothing runs in the tree while it is written (the agent's
sandbox is gone by then), so these checks and the write cannot race. tests/unit/test_nofollow.py attacks each.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def inside(root: Path, rel: str) -> Path:
    """`root/rel` for a relative path that stays inside `root` lexically (no absolute path, no `..`); ValueError
    otherwise. Links on the way are not resolved here: `real_parents` replaces them before anything is written."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise ValueError(f"changed path {rel!r} must be relative and stay inside the workspace")
    return Path(root) / rel


def real_parents(root: Path, rel: str) -> None:
    """Every ancestor of `rel` under `root` a real directory: a planted link or file on the way is removed first."""
    cur = Path(root)
    for part in Path(rel).parts[:-1]:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            cur.unlink()
        if not cur.exists():
            cur.mkdir()


def remove_entry(p: Path) -> None:
    """Remove whatever stands at `p` without following it: a link or file is unlinked, a real directory removed
    with its contents; nothing there is fine."""
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def write_inside(root: Path, rel: str, data: str | bytes, mode: int | None = None) -> Path:
    """Write `data` to `root/rel` as a new regular file, never through a link (module docstring); returns the path.
    `mode`: the file's permission bits (default: 0o666 less the umask, as `open` gives)."""
    p = inside(root, rel)
    real_parents(root, rel)
    remove_entry(p)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        if mode is not None:
            os.fchmod(f.fileno(), mode)  # on the open file: no path, so no link, between create and chmod
    return p
