"""What the overview says at a glance: whether a run is live, finished or stopped; the held-out result; the tools an
unusable call's message names.

    .venv/bin/python -m pytest -q tests/unit/test_dashboard_glance.py
"""

from __future__ import annotations

import json
import os
import time

from flywheel.envs.tools import CORE_TOOLS, TOOLS
from flywheel.metrics.dashboard.runindex import STALE_MIN_S, RunIndex
from flywheel.metrics.dashboard.server import heldout
from flywheel.metrics.dashboard.transcript import run_tools
from flywheel.policy.chat import parse_turn


def _run(tmp_path, records, summary=None):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    return RunIndex(tmp_path)


def test_a_run_is_live_while_written_then_stopped_and_finished_once_its_summary_says_so(tmp_path):
    now = time.time()
    run = _run(tmp_path, [{"step": i, "time": now - 30 + 10 * i, "loss": 1.0} for i in range(3)])
    assert run.state(now)["state"] == "live"
    old = now - 3 * STALE_MIN_S  # no write for longer than the threshold (steps here are 10 s apart)
    os.utime(tmp_path / "metrics.jsonl", (old, old))
    run.poll()
    st = run.state(now)
    assert st["state"] == "stopped" and st["why"].startswith("no new writes for") and "min" in st["why"]
    (tmp_path / "summary.json").write_text(json.dumps({"rl": {"steps": 3, "interrupted": False, "halted": None}}))
    run.poll()
    assert run.state(now)["state"] == "finished" and "3 steps" in run.state(now)["why"]
    (tmp_path / "summary.json").write_text(json.dumps({"rl": {"steps": 2, "interrupted": True, "halted": None}}))
    run.poll()
    assert run.state(now) | {"why": ""} == run.state(now) | {"state": "stopped", "why": ""}
    assert "resume" in run.state(now)["why"]


def test_a_slow_run_is_not_called_stopped_between_its_steps(tmp_path):
    """The threshold grows with the run's own step time: 5 steps of 10 min each is not a stop."""
    now = time.time()
    step_s = 600.0
    run = _run(tmp_path, [{"step": i, "time": now - (4 - i) * step_s} for i in range(5)])
    old = now - 2 * step_s
    os.utime(tmp_path / "metrics.jsonl", (old, old))
    run.poll()
    assert run.state(now)["state"] == "live"
    assert run.state(now + 6 * step_s)["state"] == "stopped"


def test_the_heldout_result_comes_from_the_summary_else_from_the_eval_files(tmp_path):
    run = _run(tmp_path, [], {"pass1_before": 0.25, "pass1_after": 0.5, "pass1_gain": 0.25, "pass1_gain_se": 0.1})
    assert heldout(run) == {"pass1_before": 0.25, "pass1_after": 0.5, "pass1_gain": 0.25, "pass1_gain_se": 0.1,
                            "source": "summary.json"}
    other = tmp_path / "evals"
    other.mkdir()
    (other / "eval_before.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "n": 2, "correct": c}) + "\n"
                                                     for i, c in enumerate([0, 1, 2, 1])))
    run = RunIndex(other)
    assert heldout(run) == {"pass1_before": 0.5, "num_tasks": 4, "source": "eval_*.jsonl"}
    (other / "eval_after.jsonl").write_text(json.dumps({"task_id": "t0", "n": 1, "correct": 1}) + "\n")
    run.poll()
    assert heldout(run)["pass1_after"] == 1.0 and heldout(run)["pass1_gain"] == 0.5
    assert heldout(RunIndex(tmp_path / "nothing")) is None


def test_an_unknown_tool_is_named_with_the_tools_that_session_had(tmp_path):
    """A session of a `tools = "core"` run had four tools: its unusable call lists those, not all seven."""
    core = run_tools({"env": {"tools": "core"}})
    assert sorted(core) == sorted(CORE_TOOLS) and len(core) < len(TOOLS)
    assert sorted(run_tools({})) == sorted(t["name"] for t in TOOLS)  # no config: every tool
    assert sorted(run_tools({"env": {"tools": "bogus"}})) == sorted(t["name"] for t in TOOLS)
    text = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    err, = parse_turn(text, core).errors
    assert err.kind == "unknown_tool" and err.message.endswith("available tools: " + ", ".join(sorted(CORE_TOOLS)))
    assert not [e for e in parse_turn(text, run_tools({"env": {"tools": "all"}})).errors if e.kind == "unknown_tool"]
