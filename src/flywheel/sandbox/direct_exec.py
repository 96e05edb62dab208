"""Commands that need no shell: run `prog arg ...` by exec instead of `bash -c "prog arg ..."`.

Starting bash costs more than starting a small sandbox's namespaces (on this 2-core machine a burst
of `bwrap ... bash -c true` spent ~22 % of all CPU in bash: dynamic loading and start-up). A command
made only of plain words — no quotes, variables, globs, redirections, pipes, separators, tildes,
assignments, comments — means exactly "exec the first word, found on PATH, with these arguments",
so `direct_argv` returns the program's path and that argv, and the sandbox execs it. Anything else, and any first word that
bash would treat itself (keywords and builtins, except `true` and `false`, whose programs behave
identically), returns None: the command goes through `bash -c` as always.

    direct_argv("python -m pytest -q t.py::test_x", ["/usr/bin"])  # ['/usr/bin/python', 'python', '-m', ...]
    direct_argv("echo $HOME", ["/usr/bin"])                                  # None: bash expands it

Differences from bash: none in the result (exit status, output); a program that is not found falls
back to bash, which prints its usual "command not found" (127).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = ["direct_argv"]

# Characters that never mean anything to bash inside a word (nothing of: space-separated words only).
_WORD = re.compile(r"[A-Za-z0-9_./:,+@%=-]+")
_PROGRAM = re.compile(r"[A-Za-z0-9_.+-]+")  # no '/' (resolved on PATH) and no '=' (an assignment)
# bash keywords and builtins (`compgen -k -b`): bash runs these itself, so they must reach bash.
_SHELL_WORDS = frozenset(
    "if then else elif fi case esac for select while until do done in function time coproc "
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt continue declare dirs "
    "disown echo enable eval exec exit export fc fg getopts hash help history jobs kill let local logout "
    "mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend test "
    "times trap type typeset ulimit umask unalias unset wait".split())


def direct_argv(command: str, path_dirs: Sequence[str]) -> list[str] | None:
    """[path of the program, argv[0], args...] to exec for `command`, or None when it needs bash."""
    words = command.split(" ")
    if not words or not all(_WORD.fullmatch(w) for w in words):  # also refuses empty words, tabs, newlines
        return None
    prog = words[0]
    if not _PROGRAM.fullmatch(prog) or prog in _SHELL_WORDS:
        return None
    for d in path_dirs:
        path = os.path.join(d, prog)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return [path, *words]
    return None
