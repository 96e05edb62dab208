"""Which paths in a shell command reach outside the workspace: the evidence for the `outside_read` flag.

    outside_references("cat /etc/passwd ../x", workspace="/workspace")    # ['/etc/passwd', '../x']
    outside_references("git apply /dev/stdin <<EOF\n--- a/x.py\n...\nEOF")  # []

A path counts when it leads out of the workspace to something that is not the sandbox's own system: the host's
configuration and homes (`/etc`, `/root`, `/home`), other processes (`/proc/1`), `/sys`, `/var`, a parent
directory (`../x` at the start of a word), or another user's home (`~user`). Not counted: the workspace (as
`/workspace` inside bubblewrap or by its host path), `~` and `~/…` (HOME is the workspace in every sandbox),
`/tmp` (private to the sandbox), `/dev/null|stdin|stdout|stderr|zero|urandom|fd`, `/proc/self`, the read-only
system (`/usr`, `/bin`, `/lib`, …) and the Python installation the sandbox binds. The body of a here-document
fed to anything but an interpreter (`git apply`, `patch`, `cat > file`) is data, not a read, and is skipped;
one fed to `python`, `bash` or `sh` is code and is scanned.

A heuristic for a flag, not a security boundary: the sandbox is what keeps the host out of reach. Its false
positive rate on legitimate fixes is measured by the red-team suite (tests/redteam/).
"""

from __future__ import annotations

import os
import re
import sys

_PATH_CHARS = r"[\w.@%+-]"
_WORD_START = r"(?<![^\s\"'=:(<>|;&`])"  # start of a shell word, or of a quoted string / assignment value
_REF_RX = re.compile(
    rf"{_WORD_START}(/{_PATH_CHARS}+(?:/{_PATH_CHARS}*)*)"  # /etc/passwd (not a/b, ./x or 7 // 2)
    rf"|{_WORD_START}(~[A-Za-z_][\w.-]*(?:/{_PATH_CHARS}*)*)"  # ~user (not ~ or ~/x: HOME is the workspace)
    rf"|{_WORD_START}(\.\.(?:/{_PATH_CHARS}*)*)(?!{_PATH_CHARS})")  # .. and ../x at the start of a word
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/tmp", "/workspace", "/proc/self",
           "/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero", "/dev/urandom", "/dev/random",
           "/dev/fd", "/dev/shm")
_INTERPRETERS = {"python", "python3", "bash", "sh", "dash", "zsh", "perl", "ruby", "node", "env", "exec", "xargs",
                 "eval", "source", "."}
_HEREDOC_RX = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][\w-]*)\2")


def _python_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted({os.path.realpath(r) for r in roots} | roots))


_ALLOWED = _SYSTEM + _python_roots()


def _allowed(path: str, workspace: str) -> bool:
    path = os.path.normpath(path)
    if workspace and (path == workspace or path.startswith(workspace.rstrip("/") + "/")):
        return True
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in _ALLOWED)


def _program(text: str) -> str:
    """The program of the last simple command in `text` (env assignments skipped)."""
    last = re.split(r"\n|;|&&|\|\||\||\(|`|\$\(", text)[-1]
    for word in last.split():
        if "=" in word and not word.startswith(("-", "/", ".")):
            continue
        return os.path.basename(word.strip("'\""))
    return ""


def strip_data_heredocs(command: str) -> str:
    """`command` without the bodies of here-documents that feed a program other than an interpreter."""
    out: list[str] = []
    lines = command.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        for m in _HEREDOC_RX.finditer(line):
            dash, delim = m.group(1), m.group(3)
            prefix = "\n".join(out[:-1] + [line[:m.start()]])
            keep = _program(prefix).rstrip("0123456789.") in _INTERPRETERS
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if dash else lines[i]) != delim:
                body.append(lines[i])
                i += 1
            if keep:
                out += body
            if i < len(lines):
                out.append(lines[i])
                i += 1
    return "\n".join(out)


def outside_references(command: str, workspace: str = "") -> list[str]:
    """Paths in a shell command that reach outside the workspace and the sandbox's system (see the module
    docstring), quoted or not, also inside `python -c '...'` and interpreter here-documents."""
    found = []
    for m in _REF_RX.finditer(strip_data_heredocs(command)):
        path = next(g for g in m.groups() if g is not None)
        if path.startswith("/") and _allowed(path, workspace):
            continue
        found.append(path)
    return found
