"""The harness over a real sandbox: every tool, every failure as an observation, truncation, path escapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.tools import (
    TOOL_NAMES,
    TOOLS,
    Harness,
    check_arguments,
    outside_references,
    truncate,
)
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.tasks.loaders import load_tasks, task_base_dir
from flywheel.types import ToolCall, ToolCallError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


@pytest.fixture()
def harness(tmp_path):
    task = load_tasks(FIX / "flywheel.jsonl").tasks[0]  # calc.py + test_calc.py
    cfg = EnvConfig(max_output_chars=300, command_timeout_s=2.0)
    sb = create_sandbox(task_base_dir(task, tmp_path / "cache"), SandboxLimits.from_config(cfg))
    h = Harness(sb, cfg, task)
    yield h
    sb.close()


def call(h: Harness, name: str, **args):
    return h.call(ToolCall(name, args))


def test_schemas_are_compact_json_schemas():
    assert TOOL_NAMES == ["view", "str_replace", "write", "bash", "run_tests", "search", "submit"]
    for t in TOOLS:
        params = t["parameters"]
        assert params["type"] == "object" and set(params.get("required", [])) <= set(params["properties"])
    import json

    assert len(json.dumps(TOOLS)) < 1400  # the whole tool list stays small for the tiny model's context


def test_view_with_line_numbers_and_ranges(harness):
    r = call(harness, "view", path="calc.py")
    assert not r.is_error and r.output.splitlines()[0] == "1\tdef clamp(x, lo, hi):"
    assert call(harness, "view", path="calc.py", start=2, end=3).output == "2\t    if x < lo:\n3\t        return lo"
    assert call(harness, "view", path="calc.py", start="4").output == "4\t    return x"  # lenient int
    assert call(harness, "view", path=".").output.splitlines() == ["calc.py", "test_calc.py"]
    for args, msg in [({"path": "nope.py"}, "no such file: nope.py"),
                      ({"path": "calc.py", "start": 9}, "out of range; calc.py has 4 lines"),
                      ({"path": "calc.py", "start": 3, "end": 1}, "before start"),
                      ({"path": "calc.py", "start": "two"}, "must be an integer")]:
        r = harness.call(ToolCall("view", args))
        assert r.is_error and msg in r.output, r.output


def test_str_replace_edits_once_and_reports_failures(harness):
    ws = Path(harness.sandbox.workspace)
    r = call(harness, "str_replace", path="calc.py", old="return x\n", new="return min(x, hi)\n")
    assert not r.is_error and "return min(x, hi)" in (ws / "calc.py").read_text()
    r = call(harness, "str_replace", path="calc.py", old="lo", new="LO")
    assert r.is_error and "occurs 3 times" in r.output
    r = call(harness, "str_replace", path="calc.py", old="  return lo", new="  return lo  # low")
    assert not r.is_error  # a substring match is fine when unique
    assert call(harness, "str_replace", path="calc.py", old="zzz", new="y").output.startswith("Error: old text not found")
    assert "no such file" in call(harness, "str_replace", path="x.py", old="a", new="b").output
    assert "must not be empty" in call(harness, "str_replace", path="calc.py", old="", new="b").output
    assert "missing argument 'new'" in call(harness, "str_replace", path="calc.py", old="a").output


def test_write_creates_files_the_sandbox_can_edit(harness):
    r = call(harness, "write", path="pkg/new.py", content="X = 1\n")
    assert not r.is_error
    r = call(harness, "bash", command="echo 'Y = 2' >> pkg/new.py && cat pkg/new.py")
    assert not r.is_error and r.output == "X = 1\nY = 2", r.output
    assert call(harness, "write", path="pkg", content="x").is_error


def test_bash_exit_codes_timeouts_and_truncation(harness):
    assert call(harness, "bash", command="echo hi").output == "hi"
    r = call(harness, "bash", command="echo oops >&2; exit 3")
    assert not r.is_error and r.output == "oops\n[exit code 3]"
    r = call(harness, "bash", command="sleep 5")
    assert r.is_error and "[timed out after 2s]" in r.output
    r = call(harness, "bash", command="python -c \"print('x' * 5000)\"")
    assert len(r.output) <= 300 and "characters truncated" in r.output
    assert call(harness, "bash", command="   ").is_error


def test_run_tests_runs_the_visible_tests(harness):
    r = call(harness, "run_tests")
    assert "1 passed" in r.output, r.output
    assert sorted(p.name for p in Path(harness.sandbox.workspace).iterdir()) == ["calc.py", "test_calc.py"]
    call(harness, "write", path="calc.py", content="def clamp(x, lo, hi):\n    return 99\n")
    r = call(harness, "run_tests")
    assert "1 failed" in r.output and "[exit code 1]" in r.output


def test_search(harness):
    r = call(harness, "search", pattern=r"return \w+$")
    assert r.output.splitlines() == ["calc.py:3: return lo", "calc.py:4: return x"]
    assert call(harness, "search", pattern="clamp", path="test_calc.py").output.startswith("test_calc.py:1:")
    assert call(harness, "search", pattern="nothing-here").output == "No matches."
    assert "bad regex" in call(harness, "search", pattern="(").output


def test_paths_outside_the_workspace_are_refused_and_logged(harness):
    for path in ("/etc/passwd", "../../x", "/"):
        r = call(harness, "view", path=path)
        assert r.is_error and "outside the workspace" in r.output
    call(harness, "bash", command="ln -s /etc/passwd leak")
    r = call(harness, "view", path="leak")  # a symlink out is resolved and refused
    assert r.is_error and "outside the workspace" in r.output
    assert sum(e["outside"] for e in harness.log) == 5  # 4 views + the `ln -s /etc/passwd`


def test_malformed_calls_are_observations_and_submit_ends(harness):
    assert "unknown tool 'rm'" in harness.call(ToolCall("rm", {})).output
    assert "arguments must be a JSON object" in harness.call(ToolCall("view", "calc.py")).output
    assert "unknown argument(s) line" in harness.call(ToolCall("view", {"path": "a", "line": 1})).output
    obs = harness.error_observation(ToolCallError("malformed_json", "expected ',' at char 12"))
    assert obs.startswith("Error (malformed_json): expected ','") and "submit" in obs
    r = call(harness, "submit")
    assert r.done and not r.is_error
    assert "already submitted" in call(harness, "view", path="calc.py").output
    assert harness.num_calls == 6 and harness.num_errors == 5
    assert harness.calls_by_tool["view"] == 3


def test_pure_helpers():
    assert truncate("abc", 10) == "abc"
    t = truncate("a" * 500 + "b" * 500, 200)
    assert len(t) <= 200 and t.startswith("aaa") and t.endswith("bbb") and "truncated" in t
    assert outside_references("cat /etc/passwd ~root/.ssh/id ../x ok.py > /dev/null") == ["/etc/passwd", "~root/.ssh/id",
                                                                                         "../x"]
    assert outside_references("python -m pytest -q test_a.py && ls /workspace/a") == []
    assert outside_references("cat /w/x", workspace="/w") == []
    assert outside_references("python -c \"open('/etc/shadow').read()\"") == ["/etc/shadow"]
    assert outside_references("python -c 'print(7 // 2, 1/2)'; ls a/b ./c; echo a..b") == []
    assert outside_references("cd .. && ls ~ ~/x") == [".."]  # HOME is the workspace in every sandbox
    # data here-documents are not reads; an interpreter's here-document is code and is scanned
    patch = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-p = '/etc/hosts'\n+p = '/etc/hosts' # ../x ~root\n"
    assert outside_references(f"git apply /dev/stdin <<'EOF'\n{patch}EOF\ncat x.py") == []
    assert outside_references(f"cat > fix.diff <<EOF\n{patch}EOF\npatch -p1 < fix.diff && ls /tmp/y") == []
    assert outside_references("python - <<EOF\nprint(open('/etc/shadow').read())\nEOF") == ["/etc/shadow"]
    assert outside_references("cat /proc/1/environ /proc/self/status sub/../a.py /usr/lib/x") == ["/proc/1/environ"]
    assert check_arguments("view", {"path": "a", "end": "3"}) == {"path": "a", "end": 3}
    with pytest.raises(Exception, match="must be a string"):
        check_arguments("bash", {"command": ["ls"]})


def test_core_tool_set_offers_and_accepts_four_tools(tmp_path):
    from flywheel.envs.tools import tools_for

    task = load_tasks(FIX / "flywheel.jsonl").tasks[0]
    cfg = EnvConfig(tools="core")
    assert [t["name"] for t in tools_for(cfg)] == ["view", "str_replace", "run_tests", "submit"]
    assert tools_for(EnvConfig()) is TOOLS
    with create_sandbox(task_base_dir(task, tmp_path / "cache"), SandboxLimits.from_config(cfg)) as sb:
        h = Harness(sb, cfg, task)
        r = h.call(ToolCall("bash", {"command": "ls"}))
        assert r.is_error and "unknown tool 'bash'; tools: view, str_replace, run_tests, submit" in r.output
        assert not h.call(ToolCall("view", {"path": "calc.py"})).is_error


@pytest.mark.timeout(30)
def test_fifos_and_special_files_never_block_the_harness(harness):
    assert not call(harness, "bash", command="mkfifo pipe && mkdir d && mkfifo d/p2").is_error
    r = call(harness, "view", path="pipe")
    assert r.is_error and "not a regular file" in r.output
    assert "not a regular file" in call(harness, "str_replace", path="pipe", old="a", new="b").output
    assert "not a regular file" in call(harness, "write", path="pipe", content="x").output
    assert call(harness, "search", pattern="clamp").output.startswith("calc.py:1:")
    assert "pipe" in call(harness, "view", path=".").output
