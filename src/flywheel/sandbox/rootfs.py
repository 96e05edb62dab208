"""A prepared read-only root for bwrap sandboxes, built once per process; the exec helper; a reaper.

Why: bubblewrap parses /proc/self/mountinfo once per bind it makes (to remount it read-only), and
that text holds every mount of the host's mount namespace. Spelling the sandbox's view as separate
``--ro-bind /usr``, ``/etc``, the Python install, ``--dev /dev`` (six device binds) and ``--proc``
(four more covering binds) cost ~15 parses per sandbox; with 60-200 overlay mounts alive on the
host (a burst of sandboxes, or leftovers of killed processes) each parse cost ~1 ms, and the
sandbox spent three times as long as a bare bwrap. Here the view is assembled *once*: a small
tmpfs (``flywheel-root-<pid>-*`` under the sandbox directory) holding read-only binds of /usr, /etc
and the Python roots, the usual /bin, /lib... symlinks, real device nodes (null, zero, full,
random, urandom, tty), /dev/shm -> /tmp and the exec helper; every sandbox binds that tree with a
single ``--dev-bind ROOT /`` (bwrap keeps each mount's read-only flag; ``--dev-`` keeps the nodes
usable). What a sandbox sees is the same as before except: no /dev/pts (no pseudo-terminals), and
/dev is read-only (its nodes work; /dev/shm is the private /tmp).

The exec helper (C source below, compiled once with `cc` and cached under ~/.cache/flywheel, used
only when root-owned and not group/world-writable) sets the limits, switches to the sandbox uid and
sets no_new_privs, then execs bash: the work `setpriv` and `ulimit` did, at a fraction of the cost.

`reap_stale` removes what processes killed with SIGKILL left behind (their workspace overlays and
prepared roots): each such directory names its owner pid, in its name or in its group (the
per-sandbox gid, `1e9 + pid * 1e4 + slot`), and is removed only when no process with that pid is
alive. Leftover mounts are not only litter: every one of them makes every later bwrap slower.
Assumption: every process that keeps sandboxes under the directory lives in this pid namespace.

    from flywheel.sandbox.rootfs import bwrap_system_args, prepared_root, reap_stale
    root = prepared_root("/dev/shm", ("/work/main/.venv",))   # None where it cannot be built
    args, has_helper = bwrap_system_args("/usr/bin/bwrap", "/dev/shm", 256 << 20, ("/work/main/.venv",))
    reap_stale("/dev/shm")                                       # -> number of directories removed

Tests: `pytest tests/unit/test_sandbox.py` (the prepared root, the helper, the reaper, and every
adversarial sandbox test run through this path).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from flywheel.sandbox.workspace import libc, umount

__all__ = ["EXEC_PATH", "ROOT_PREFIX", "bwrap_system_args", "exec_helper", "prepared_root", "reap_stale"]

ROOT_PREFIX = "flywheel-root-"
_WS_PREFIX = "flywheel-sb-"
_UID_BASE = 1_000_000_000
_UID_SLOTS = 10_000
_PID_MOD = 100_000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
# (name, major, minor): what bwrap's --dev offers, minus the pty devices
_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
_DEV_LINKS = (("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
              ("fd", "/proc/self/fd"), ("core", "/proc/kcore"), ("shm", "/tmp"))
_TMPFS_OPTS = "mode=0755,size=4m,nr_inodes=4096"
_lock = threading.Lock()
EXEC_PATH = "/.sandbox/exec"  # the helper's path inside the sandbox

# The sandbox's first process after bwrap: limits (soft = hard, set while still root so they bind),
# then the per-sandbox uid (which drops every capability), then no_new_privs, then exec. It replaces
# `setpriv ... bash -c 'ulimit ...; cmd'`: setpriv (dynamically linked, libcap-ng) cost ~3 ms a run; a
# static glibc build of this ~0.6 ms of CPU (start-up probing); without libc it costs ~0.1 ms.
_EXEC_C = r"""/* The sandbox's first process after bwrap (see rootfs.py). usage: exec UID CPU_S AS_BYTES NPROC FSIZE_BYTES PATH ARGV0 ARGS...
   Sets the limits (soft = hard, no core files) while still root, drops to UID (which clears every capability),
   sets no_new_privs and execs PATH with the arguments ARGV0 ARGS... (argv[0] as a shell would set it). Any failure: a message on stderr and exit status 125.
   No libc where the architecture allows (x86_64, aarch64): glibc's start-up (CPU feature probing by cpuid,
   which traps in a VM) cost more than everything this program does. */
#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(FLYWHEEL_LIBC)
#define NOLIBC 1
typedef unsigned long u64;
#if defined(__x86_64__)
enum { SYS_write = 1, SYS_execve = 59, SYS_setresuid = 117, SYS_getresuid = 118, SYS_setresgid = 119,
       SYS_setgroups = 116, SYS_prctl = 157, SYS_setrlimit = 160, SYS_exit = 60 };
/* arguments 4 and 5 are always 0 (prctl insists on it) */
static long sc(long n, long a, long b, long c) {
  register long r10 __asm__("r10") = 0, r8 __asm__("r8") = 0; long r;
  __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
  return r; }
__asm__(".global _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call cstart\n hlt\n");
#else
enum { SYS_write = 64, SYS_execve = 221, SYS_setresuid = 147, SYS_getresuid = 148, SYS_setresgid = 149,
       SYS_setgroups = 159, SYS_prctl = 167, SYS_setrlimit = 164, SYS_exit = 93 };
static long sc(long n, long a, long b, long c) {
  register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = 0, x4 __asm__("x4") = 0;
  __asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory"); return x0; }
__asm__(".global _start\n_start:\n mov x29, #0\n mov x0, sp\n bl cstart\n");
#endif
static unsigned long len(const char *s) { unsigned long n = 0; while (s[n]) n++; return n; }
static void die(const char *what, const char *arg) {
  sc(SYS_write, 2, (long)"sandbox exec: ", 14); sc(SYS_write, 2, (long)what, len(what));
  if (arg) { sc(SYS_write, 2, (long)": ", 2); sc(SYS_write, 2, (long)arg, len(arg)); }
  sc(SYS_write, 2, (long)"\n", 1);
  for (;;) sc(SYS_exit, 125, 0, 0);
}
static u64 num(const char *arg) {
  u64 v = 0; const char *s = arg; if (!*s) die("not a number", arg);
  for (; *s; s++) { if (*s < '0' || *s > '9' || v > 1844674407370955160UL) die("not a number", arg); v = v * 10 + (u64)(*s - '0'); }
  return v;
}
static void lim(int res, u64 v) { u64 r[2] = {v, v}; if (sc(SYS_setrlimit, res, (long)r, 0)) die("setrlimit failed", 0); }
void cstart(long *sp) {
  long argc = sp[0]; char **argv = (char **)(sp + 1); char **envp = argv + argc + 1;
  if (argc < 8) die("usage: exec UID CPU_S AS_BYTES NPROC FSIZE_BYTES PATH ARGV0 ARGS...", 0);
  u64 u = num(argv[1]);
  if (u > 0xfffffffeUL) die("uid out of range", argv[1]);
  lim(0 /* CPU */, num(argv[2])); lim(9 /* AS */, num(argv[3])); lim(6 /* NPROC */, num(argv[4]));
  lim(1 /* FSIZE */, num(argv[5])); lim(4 /* CORE */, 0);
  if (u != 0) {
    if (sc(SYS_setgroups, 0, 0, 0)) die("setgroups failed", 0);
    if (sc(SYS_setresgid, (long)u, (long)u, (long)u)) die("setresgid failed", 0);
    if (sc(SYS_setresuid, (long)u, (long)u, (long)u)) die("setresuid failed", 0);
    unsigned int r = 1, e = 1, s = 1;
    if (sc(SYS_getresuid, (long)&r, (long)&e, (long)&s) || r != u || e != u || s != u) die("uid check failed", 0);
  }
  if (sc(SYS_prctl, 38 /* PR_SET_NO_NEW_PRIVS */, 1, 0)) die("no_new_privs failed", 0);
  sc(SYS_execve, (long)argv[6], (long)(argv + 7), (long)envp);
  die("cannot execute", argv[6]);
}
#else
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
static void die(const char *what, const char *arg) { fprintf(stderr, "sandbox exec: %s%s%s\n", what, arg ? ": " : "", arg ? arg : ""); _exit(125); }
static unsigned long long num(const char *s) { char *e; errno = 0; unsigned long long v = strtoull(s, &e, 10);
  if (errno || *e || !*s || *s == '-') die("not a number", s);
  return v;
}
static void lim(int res, unsigned long long v) { struct rlimit r = {v, v}; if (setrlimit(res, &r)) die("setrlimit failed", 0); }
int main(int argc, char **argv) {
  if (argc < 8) die("usage: exec UID CPU_S AS_BYTES NPROC FSIZE_BYTES PATH ARGV0 ARGS...", 0);
  unsigned long long u = num(argv[1]);
  if (u > 0xfffffffeULL) die("uid out of range", argv[1]);
  lim(RLIMIT_CPU, num(argv[2])); lim(RLIMIT_AS, num(argv[3])); lim(RLIMIT_NPROC, num(argv[4]));
  lim(RLIMIT_FSIZE, num(argv[5])); lim(RLIMIT_CORE, 0);
  if (u != 0) {
    if (setgroups(0, NULL)) die("setgroups failed", 0);
    if (setresgid(u, u, u)) die("setresgid failed", 0);
    if (setresuid(u, u, u)) die("setresuid failed", 0);
    uid_t r, e, s; if (getresuid(&r, &e, &s) || r != u || e != u || s != u) die("uid check failed", 0);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs failed", 0);
  execv(argv[6], argv + 7);
  die("cannot execute", argv[6]);
  return 125;
}
#endif
"""


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = libc().mount(None if src is None else src.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), flags, None if data is None else data.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {target}: {os.strerror(err)}")


def _ro_bind(src: str, dst: str) -> None:
    _mount(src, dst, None, _MS_BIND | _MS_REC)
    # A bind is writable until remounted. Read-only here is what keeps the sandbox's system read-only:
    # bwrap binds this tree with --dev-bind (so the device nodes work), which keeps each mount's flags.
    _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flywheel"


def _trusted(path: Path) -> bool:
    """A regular file that only root can have written (a cache is only used when it passes this)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022 and st.st_mode & 0o100 != 0


@functools.lru_cache(maxsize=1)
def exec_helper() -> str | None:
    """The compiled helper (cached by source hash under ~/.cache/flywheel), or None without a C compiler."""
    digest = hashlib.sha256(_EXEC_C.encode()).hexdigest()[:16]
    cached = _cache_dir() / f"sandbox-exec-{digest}"
    if _trusted(cached):
        return str(cached)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    work = Path(tempfile.mkdtemp(prefix="flywheel-cc-"))
    try:
        (work / "exec.c").write_text(_EXEC_C)
        # no libc (x86_64, aarch64) > static glibc > plain: each exec of it pays its start-up
        for flags in (["-static", "-nostdlib", "-fno-stack-protector", "-fno-builtin"],
                      ["-static", "-DFLYWHEEL_LIBC"], ["-DFLYWHEEL_LIBC"]):
            r = subprocess.run([cc, "-O2", *flags, "-o", str(work / "exec"), str(work / "exec.c")],
                               capture_output=True, timeout=120, check=False)
            if r.returncode == 0:
                break
        else:
            return None
        os.chmod(work / "exec", 0o755)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            os.replace(work / "exec", cached)
        except OSError:
            return None
        return str(cached) if _trusted(cached) else None
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mkdirs(root: Path, path: str) -> Path:
    """Create `path` (absolute) under `root`, every level world-traversable (0755)."""
    p = root
    for part in Path(path).parts[1:]:
        p = p / part
        if not p.exists():
            p.mkdir()
            os.chmod(p, 0o755)
    return p


@functools.cache
def _prepared_root_cached(tmp_root: str, python_roots: tuple[str, ...], pid: int) -> str | None:
    # `pid` in the key: a forked child builds its own (the parent removes its root when it exits)
    if os.geteuid() != 0:
        return None
    d = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=tmp_root))
    os.chmod(d, 0o755)
    mounted = False
    try:
        # no MS_NODEV: the device nodes below must work; nosuid all the same
        _mount("flywheel-root", str(d), "tmpfs", _MS_NOSUID, _TMPFS_OPTS)
        mounted = True
        for name in ("usr", "etc", "proc", "tmp", "dev", "workspace", "env"):
            (d / name).mkdir(mode=0o755)
        os.chmod(d / "tmp", 0o1777)
        for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
            host = f"/{name}"
            if os.path.islink(host):
                os.symlink(os.readlink(host), d / name)
            elif os.path.isdir(host):
                (d / name).mkdir(mode=0o755)
                _ro_bind(host, str(d / name))
        for name, major, minor in _DEVICES:
            os.mknod(d / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(d / "dev" / name, 0o666)
        for name, target in _DEV_LINKS:
            os.symlink(target, d / "dev" / name)
        _ro_bind("/usr", str(d / "usr"))
        _ro_bind("/etc", str(d / "etc"))
        for r in python_roots:
            _ro_bind(r, str(_mkdirs(d, r)))
        helper = exec_helper()
        if helper is not None:
            (d / ".sandbox").mkdir(mode=0o755)
            shutil.copy2(helper, d / EXEC_PATH.lstrip("/"))
            os.chmod(d / EXEC_PATH.lstrip("/"), 0o755)
        _mount(None, str(d), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID, _TMPFS_OPTS)
        writable = [m for m in [d, d / "usr", d / "etc", *(d / r.lstrip("/") for r in python_roots)]
                    if not os.statvfs(m).f_flag & os.ST_RDONLY]
        if writable:
            raise OSError(0, f"prepared root is not read-only at {writable}")
    except OSError:
        if mounted:
            umount(d)
        shutil.rmtree(d, ignore_errors=True)
        return None
    atexit.register(_remove_root, str(d), os.getpid())
    return str(d)


def _reset_lock_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _remove_root(d: str, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child exiting: the root is its parent's
        return
    try:
        umount(Path(d))  # MNT_DETACH takes the binds inside with it
        os.rmdir(d)
    except OSError:
        pass


def under_tmp(paths) -> list[str]:
    """The paths that lie under /tmp, which a sandbox's private /tmp covers: they must be bound again over it."""
    return [p for p in paths if p == "/tmp" or p.startswith("/tmp/")]


def prepared_root(tmp_root: str, python_roots: tuple[str, ...]) -> str | None:
    """The read-only root (built on first use in this process), or None where it cannot be built
    (not root, or no tmpfs/bind/mknod here): the caller then spells the view out bind by bind.

    `python_roots` must not lie under /tmp (the sandbox's private /tmp would hide them)."""
    assert not under_tmp(python_roots), python_roots
    with _lock:
        return _prepared_root_cached(os.path.realpath(tmp_root), tuple(python_roots), os.getpid())


def _owner_pid(entry: os.DirEntry) -> int | None:
    """The pid (modulo 1e5 for workspaces) of the process that made a sandbox directory, or None."""
    name = entry.name
    if name.startswith(ROOT_PREFIX):
        head = name[len(ROOT_PREFIX):].split("-", 1)[0]
        return int(head) if head.isdigit() else None
    if name.startswith(_WS_PREFIX):
        gid = entry.stat(follow_symlinks=False).st_gid
        if gid >= _UID_BASE:
            return ((gid - _UID_BASE) // _UID_SLOTS) % _PID_MOD
    return None


def reap_stale(tmp_root: str) -> int:
    """Unmount and remove sandbox directories under `tmp_root` whose owner process is gone.

    A directory is removed only when no live process has its owner pid (for workspaces, whose gid
    records the pid modulo 1e5, no live pid with that residue), so a sandbox in use is never touched.
    Returns the number of directories removed."""
    if os.geteuid() != 0:
        return 0
    try:
        entries = [e for e in os.scandir(tmp_root) if e.name.startswith((ROOT_PREFIX, _WS_PREFIX))]
    except OSError:
        return 0
    if not entries:
        return 0
    live = {int(n) for n in os.listdir("/proc") if n.isdigit()}
    live_mod = {p % _PID_MOD for p in live}
    removed = 0
    for e in entries:
        try:
            owner = _owner_pid(e)
            if owner is None or not e.is_dir(follow_symlinks=False):
                continue
            is_root_dir = e.name.startswith(ROOT_PREFIX)
            if (owner in live) if is_root_dir else (owner in live_mod):
                continue
            path = Path(e.path)
            for m in (path / "ws", path):
                umount(m)
            shutil.rmtree(path, ignore_errors=True)
            removed += 0 if path.exists() else 1
        except OSError:
            continue
    return removed


def bwrap_system_args(bwrap: str, tmp_root: str, tmp_bytes: int,
                      python_roots: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """bwrap's arguments up to the workspace bind (the same for every sandbox of a process), and whether
    the prepared root carries the exec helper. Without a prepared root (not root, or it could not be
    built) the view is spelled out bind by bind, as before it existed."""
    # No --new-session: bwrap already starts in a session of its own with no controlling terminal
    # (start_new_session, stdin a file), so TIOCSTI injection has no terminal; it cost ~3 ms a run.
    a = [bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
         "--unshare-cgroup-try", "--die-with-parent", "--hostname", "sandbox"]
    roots = python_roots
    in_tmp = under_tmp(roots)
    prepared = prepared_root(tmp_root, tuple(r for r in roots if r not in in_tmp))
    if prepared is not None:  # one bind for the whole system view
        # --dev-bind keeps the device nodes usable; every mount in it is read-only on the host already
        a += ["--dev-bind", prepared, "/", "--proc", "/proc"]
        a += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
        made: set[str] = {"/", "/tmp"}
        binds = in_tmp
    else:
        a += ["--ro-bind", "/usr", "/usr"]
        for d in ("bin", "lib", "lib32", "lib64", "sbin"):
            p = f"/{d}"
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                a += ["--ro-bind", p, p]
        a += ["--ro-bind", "/etc", "/etc"]
        # The private /tmp first: the interpreter's own tree may live under /tmp (a CI checkout there), and
        # a bind made before the tmpfs would be hidden by it.
        a += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
        made = {"/", "/usr", "/etc", "/tmp"}
        binds = list(roots)
    for r in binds:
        parts = Path(r).parts
        for i in range(2, len(parts)):
            anc = str(Path(*parts[:i]))
            if anc not in made:
                a += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        a += ["--ro-bind", r, r]
    return tuple(a), prepared is not None and os.path.isfile(prepared + EXEC_PATH)
