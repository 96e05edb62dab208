"""Plain-word commands skip bash (`sandbox/direct_exec.py`) with the same results as through bash."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.sandbox.direct_exec import direct_argv
from flywheel.sandbox.sandbox import SandboxLimits, bwrap_available, create_sandbox, materialize_base

PATH = ["/usr/local/bin", "/usr/bin", "/bin"]


@pytest.mark.parametrize("command", [
    "echo hi",                 # a builtin: bash runs its own
    "true; rm x", "ls | wc", "ls > out", "ls && ls", "ls\nls", "ls\tx",  # separators, redirections, pipes
    "ls $HOME", "ls *.py", "ls ~", "ls 'a b'", 'ls "a"', "ls a#b", "ls {a,b}", "ls a\\ b", "ls (a)",
    "FOO=1 ls", "./run.sh", "bin/x", "time ls", "cd /", "export A=1", "",  "ls  -a",  # ...
    "no-such-program-xyz --flag",  # not on PATH: bash reports it
])
def test_needs_bash(command: str) -> None:
    assert direct_argv(command, PATH) is None


def test_plain_words_are_execd_from_path() -> None:
    assert direct_argv("true", PATH) == ["/usr/bin/true", "true"]
    assert direct_argv("ls -la --color=never a/b.py:3 x,y +z @w 50%", PATH) == [
        "/usr/bin/ls", "ls", "-la", "--color=never", "a/b.py:3", "x,y", "+z", "@w", "50%"]


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not usable")
def test_same_results_as_bash_inside_a_sandbox(tmp_path: Path) -> None:
    base = materialize_base({"a.txt": "a\n", "sub/b.txt": "b\n"}, tmp_path / "base")
    with create_sandbox(base, SandboxLimits(timeout_s=20), "bwrap") as sb:
        argv = sb._argv("ls -a sub", 3, sb._run_env(None)["PATH"])
        if "/bin/bash" in argv:
            pytest.skip("the exec helper is unavailable here: every command goes through bash")
        assert argv[-4:] == ["/usr/bin/ls", "ls", "-a", "sub"]
        for cmd in ["ls -a sub", "false", "cat a.txt missing.txt", "python -c pass", "true"]:
            direct = sb.run(cmd)
            shell = sb.run(f"{cmd};")  # the trailing ';' sends the same command through bash
            assert (direct.returncode, direct.stdout) == (shell.returncode, shell.stdout), cmd
            assert direct.stderr == shell.stderr, cmd
