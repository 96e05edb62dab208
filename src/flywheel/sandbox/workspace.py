"""Copy-on-write workspaces: one task base on disk, many cheap private views of it.

A task's files are written once by `materialize_base` (the *base*, never modified afterwards). Every
sandbox session then gets a private, writable view of the base made in O(1), whatever the number of
files:

* ``overlay`` (root or CAP_SYS_ADMIN, the default where it works): an overlayfs mount per session,
  ``lowerdir`` = the base, ``upperdir``/``workdir`` private to the session. Creating the view is a
  single mount(2) call (~0.1 ms, done through libc, not by spawning `mount`); a write copies the one
  file up into the session's upper dir, so the base cannot change through the view — neither by
  ``echo x >> file`` inside a sandbox nor by host-side Python writing to ``workspace / "file"``.
  100 sessions of one task cost the base once plus what each session changed.
* ``copy`` (fallback where overlay cannot be mounted: a non-root laptop, or a root filesystem that is
  itself an overlay): ``cp -a --reflink=auto``. On btrfs/XFS that is a reflink per file (shared
  blocks, still one metadata operation per file); on ext4 it is a full copy, O(size of the task).
  A hardlink farm was rejected: hardlinks share the inode, so ``echo x >> file`` would write through
  to the base, and "break on write" cannot be enforced for shell commands.

The base directory is made root-only (mode 0700) with world-writable contents (0666 files, 0777 dirs):
sandboxed commands run as a per-sandbox unprivileged uid (see `sandbox.py`), which must be able to
modify the files after copy-up but must never reach the base itself by its host path.

    from flywheel.sandbox.workspace import materialize_base, create_workspace
    base = materialize_base({"src/app.py": "print(1)\\n"})
    ws = create_workspace(base, owner_uid=None)   # ws.path is the merged, writable view
    ws.close()                                      # unmount and remove; idempotent
    close_in_background(ws); flush_closed()         # the same off the critical path, and waiting for it
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path, PurePosixPath

_MNT_DETACH = 2

__all__ = ["Workspace", "close_in_background", "create_workspace", "default_tmp_root", "flush_closed", "materialize_base",
           "overlay_available", "workspace_mode"]


@functools.lru_cache(maxsize=1)
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if any(c in str(p) for p in (lower, upper, work) for c in ",:"):
        raise ValueError(f"overlay paths may not contain ',' or ':' (got {opts!r}); use plain directory names")
    rc = libc().mount(b"overlay", str(target).encode(), b"overlay", 0, opts.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay on {target}: {os.strerror(err)}")


def umount(target: Path) -> None:
    if libc().umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point (already gone); ENOENT
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def default_tmp_root() -> str:
    """Where sandboxes keep their private directories: $FLYWHEEL_SANDBOX_DIR, else /dev/shm, else $TMPDIR.

    A tmpfs matters: overlayfs syncs its upper file system on unmount and removing a directory tree on
    an ext4 disk mounted with `discard` costs ~20 ms, against well under 1 ms on tmpfs. What a session
    writes then lives in memory (bounded per file by the sandbox's file-size limit).
    """
    env = os.environ.get("FLYWHEEL_SANDBOX_DIR")
    if env:
        return env
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


@functools.lru_cache(maxsize=8)
def overlay_available(tmp_root: str | None = None) -> bool:
    """True when this process can mount overlayfs under `tmp_root` (probed once, by really mounting)."""
    if os.geteuid() != 0:
        return False
    probe = Path(tempfile.mkdtemp(prefix="flywheel-ovprobe-", dir=tmp_root))
    try:
        for d in ("l", "u", "w", "m"):
            (probe / d).mkdir()
        (probe / "l" / "f").write_text("x")
        try:
            _mount_overlay(probe / "l", probe / "u", probe / "w", probe / "m")
        except OSError:
            return False
        ok = (probe / "m" / "f").read_text() == "x"
        umount(probe / "m")
        return ok
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def workspace_mode(tmp_root: str | None = None) -> str:
    """'overlay' (O(1) copy-on-write) where it can be mounted, else 'copy'."""
    tmp_root = tmp_root or default_tmp_root()
    return "overlay" if overlay_available(tmp_root) else "copy"


def _check_rel_path(rel: str) -> PurePosixPath:
    if not isinstance(rel, str) or not rel:
        raise TypeError(f"task file paths must be non-empty strings (got {rel!r})")
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or "\\" in rel or "\x00" in rel:
        raise ValueError(f"task file path {rel!r} must be relative, inside the workspace, without '..'")
    return p


def base_permissions(root: Path) -> None:
    """The sandbox's convention for a base (this module): contents world-writable (sandboxed
    commands run as an unprivileged uid and must edit the copied-up files), the base itself root-only."""
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777)
        for f in filenames:
            fp = os.path.join(dirpath, f)
            if not os.path.islink(fp):
                os.chmod(fp, 0o777 if os.access(fp, os.X_OK) else 0o666)
    os.chmod(root, 0o700)


def materialize_base(files: dict[str, str], dest: Path | None = None) -> Path:
    """Write a task's files once into `dest` (a new temp dir by default) and return it.

    The result is the lower layer of every workspace of that task and must not be modified afterwards
    (nor removed while a workspace over it is open); the caller removes it (`shutil.rmtree`) when the
    task is done. Files starting with ``#!`` are made executable.
    """
    if not isinstance(files, dict):
        raise TypeError(f"files must be a dict of relative path -> text (got {type(files).__name__})")
    if dest is None:
        dest = Path(tempfile.mkdtemp(prefix="flywheel-base-"))
    else:
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise ValueError(f"base directory {dest} is not empty; pass a new or empty directory")
    for rel, text in files.items():
        p = _check_rel_path(rel)
        if not isinstance(text, str):
            raise TypeError(f"contents of task file {rel!r} must be str (got {type(text).__name__})")
        target = dest.joinpath(*p.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o777 if text.startswith("#!") else 0o666)
    for dirpath, dirnames, _ in os.walk(dest):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777)
    dest.chmod(0o700)  # only root (the mounter) reaches the base by its host path
    return dest


class Workspace:
    """A private writable view of a base: `path` is the live directory; `close()` removes it.

    `root` is the session's private directory (mode 0710, group = the sandbox uid's gid) holding upper/, work/, the
    mount point ws/ and whatever the sandbox keeps beside the workspace (`scratch(name)`).
    """

    def __init__(self, base: Path, owner_uid: int | None = None, tmp_root: str | None = None,
                 mode: str | None = None) -> None:
        base = Path(base)
        if not base.is_dir():
            raise ValueError(f"workspace base {base} is not a directory; build it with materialize_base()")
        self.base = base.resolve()
        tmp_root = tmp_root or default_tmp_root()
        self.mode = mode or workspace_mode(tmp_root)
        if self.mode not in ("overlay", "copy"):
            raise ValueError(f"workspace mode must be 'overlay' or 'copy' (got {self.mode!r})")
        self.root = Path(tempfile.mkdtemp(prefix="flywheel-sb-", dir=tmp_root))
        self.path = self.root / "ws"
        self._mounted = False
        self._closed = False
        try:
            if owner_uid is None:
                os.chmod(self.root, 0o711)
            else:  # only root and the sandbox's own gid may enter: other sandboxes' uids cannot reach it
                os.chown(self.root, 0, owner_uid)
                os.chmod(self.root, 0o710)
            if self.mode == "overlay":
                upper, work = self.root / "upper", self.root / "work"
                upper.mkdir()
                work.mkdir()
                self.path.mkdir()
                if owner_uid is not None:
                    os.chown(upper, owner_uid, owner_uid)
                _mount_overlay(self.base, upper, work, self.path)
                self._mounted = True
            else:
                subprocess.run(["cp", "-a", "--reflink=auto", f"{self.base}/.", str(self.path)],
                               check=True, capture_output=True)
                os.chmod(self.path, 0o755)
                if owner_uid is not None:
                    os.chown(self.path, owner_uid, owner_uid)
        except BaseException:
            self.close()
            raise

    def scratch(self, name: str, owner_uid: int | None = None, mode: int = 0o700) -> Path:
        """A private directory beside the workspace (outside it), removed on close."""
        p = self.root / name
        p.mkdir(exist_ok=True)
        if owner_uid is not None:
            os.chown(p, owner_uid, owner_uid)
        os.chmod(p, mode)
        return p

    def close(self) -> None:
        """Unmount and delete everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._mounted:
            umount(self.path)
            self._mounted = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Closer:
    """Unmounts and removes closed workspaces off the caller's critical path.

    Unmounting waits for an RCU grace period (0.5 ms on an idle machine, ~5 ms on a loaded one) and
    the tree removal is a few dozen syscalls: a sandbox's `close()` kills its processes itself and
    hands the rest to a few threads here (several, so grace periods overlap in a burst); `then` runs
    once the directory is gone (a sandbox releases its uid there). `flush()` waits for everything
    handed over; where threads cannot be started (interpreter exit) the caller does the work itself.
    """

    def __init__(self, num_threads: int = 4) -> None:
        self._num_threads = num_threads
        self._lock = threading.RLock()  # re-entrant: a sandbox's __del__ may close it during submit()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._pending: set[Future] = set()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # the parent's threads do not exist here and its lock may have been held by one of them
        self._lock = threading.RLock()
        self._pool, self._pool_pid, self._pending = None, 0, set()

    @staticmethod
    def _finish(ws: Workspace, then: Callable[[], None] | None) -> None:
        try:
            ws.close()
        finally:
            if then is not None:
                then()

    def submit(self, ws: Workspace, then: Callable[[], None] | None) -> None:
        fut: Future | None
        with self._lock:
            try:
                if self._pool is None or self._pool_pid != os.getpid():  # a forked child has no threads
                    self._pool = ThreadPoolExecutor(self._num_threads, thread_name_prefix="sandbox-close")
                    self._pool_pid = os.getpid()
                    self._pending = set()
                fut = self._pool.submit(self._finish, ws, then)
            except RuntimeError:  # interpreter shutting down: no new threads
                fut = None
            else:
                self._pending.add(fut)
        if fut is None:
            self._finish(ws, then)
        else:
            fut.add_done_callback(self._done)

    def _done(self, fut: Future) -> None:
        with self._lock:
            self._pending.discard(fut)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every closed sandbox's directory is unmounted and removed; False on timeout."""
        with self._lock:
            pending = list(self._pending)
        _, not_done = futures_wait(pending, timeout=timeout_s)
        for fut in pending:
            err = fut.exception() if fut.done() else None
            if err is not None:
                raise err
        return not not_done


_CLOSER = _Closer()


def close_in_background(ws: Workspace, then: Callable[[], None] | None = None) -> None:
    """`ws.close()` (then `then()`) on a background thread; `flush_closed` waits for it."""
    _CLOSER.submit(ws, then)


def flush_closed(timeout_s: float | None = None) -> bool:
    """Block until every workspace handed to `close_in_background` is unmounted and removed; False on timeout."""
    return _CLOSER.flush(timeout_s)


def create_workspace(base: Path, owner_uid: int | None = None, tmp_root: str | None = None) -> Workspace:
    """A copy-on-write view of `base` whose top directory belongs to `owner_uid` (None: the caller)."""
    return Workspace(base, owner_uid=owner_uid, tmp_root=tmp_root)
