"""Grading in a fresh sandbox: per-test results, restored tests, anti-cheat flags, partial credit, the judge."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_tasks import FIX, make_repo

from flywheel.config import EnvConfig
from flywheel.envs.judge import RubricJudge, RubricScore, combine, parse_scores
from flywheel.envs.reward import (
    detect_flags,
    grade,
    junit_key,
    parse_junit,
    score_tests,
    statuses_of,
    workspace_diff,
)
from flywheel.tasks.loaders import load_tasks, task_base_dir
from flywheel.types import Generation, Reward

FIXED = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"


@pytest.fixture()
def task():
    return load_tasks(FIX / "flywheel.jsonl").tasks[0]


def workspace(tmp_path: Path, task, **changes: str | None) -> Path:
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    files = dict(task.files)
    files.update(changes)
    for rel, text in files.items():
        if text is not None:
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
    return ws


def test_fixed_workspace_scores_one_and_untouched_scores_zero(tmp_path, task):
    cfg = EnvConfig()
    r = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED}), cfg)
    assert r.value == 1.0 and r.flags == [] and r.components == {"tests": 1.0, "penalty": 0.0, "suite_verdict": 1.0, "twins": 1.0}
    assert r.tests == {"test_hidden.py::test_high": "passed", "test_hidden.py::test_mid": "passed",
                       "test_calc.py::test_low": "passed"}
    r = grade(task, workspace(tmp_path, task), cfg)
    assert r.value == 0.0 and r.tests["test_hidden.py::test_high"] == "failed"
    assert r.tests["test_hidden.py::test_mid"] == "passed"


def test_partial_credit(tmp_path, task):
    r = grade(task, workspace(tmp_path, task), EnvConfig(partial_credit=True))
    assert r.value == pytest.approx(2 / 3)


def test_edited_tests_are_ignored_and_flagged(tmp_path, task):
    cheat = {"test_calc.py": "def test_low():\n    assert True\n",
             "test_hidden.py": "def test_high():\n    pass\n\n\ndef test_mid():\n    pass\n"}
    r = grade(task, workspace(tmp_path, task, **cheat), EnvConfig())
    assert r.tests["test_hidden.py::test_high"] == "failed"  # the real hidden test ran
    assert r.flags == ["tests_edited"] and r.value == -1.0 and r.components["tests"] == 0.0
    # the fix plus an edited visible test: the fix counts, the edit is still penalised
    r = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED, "test_calc.py": "x = 1\n"}),
              EnvConfig(flag_penalties={"tests_edited": 0.25}))
    assert r.components["tests"] == 1.0 and r.value == 0.75 and r.flags == ["tests_edited"]
    # deleting a test file is an edit too
    assert detect_flags(task, workspace(tmp_path, task, **{"test_calc.py": None}), EnvConfig()) == ["tests_edited"]


def test_conftest_plugin_is_removed_and_flagged(tmp_path, task):
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    out = yield\n    rep = out.get_result()\n    rep.outcome = 'passed'\n")
    r = grade(task, workspace(tmp_path, task, **{"conftest.py": hook}), EnvConfig())
    assert r.flags == ["conftest_added"] and r.components["tests"] == 0.0
    r = grade(task, workspace(tmp_path, task, **{"pytest.ini": "[pytest]\naddopts = -p no:python\n"}), EnvConfig())
    assert r.flags == ["conftest_added"] and r.tests["test_hidden.py::test_mid"] == "passed"  # config restored


def test_process_exit_in_the_solution_fails_and_is_flagged(tmp_path, task):
    for src in ("import os\nos._exit(0)\n" + FIXED, "import sys\n" + FIXED + "sys.exit(0)\n"):
        r = grade(task, workspace(tmp_path, task, **{"calc.py": src}), EnvConfig())
        assert "sys_exit" in r.flags and r.components["tests"] == 0.0
        assert set(r.tests.values()) <= {"missing", "error", "failed"}, r.tests


def test_skipped_tests_count_as_failed(tmp_path, task):
    src = "import pytest\npytest.skip('later', allow_module_level=True)\n" + FIXED
    r = grade(task, workspace(tmp_path, task, **{"calc.py": src}), EnvConfig())
    assert set(r.tests.values()) <= {"skipped", "missing", "error"} and r.components["tests"] == 0.0
    assert r.flags == ["framework_patch"]  # pytest named in non-test code (envs/integrity.py)


def test_tool_log_flags(tmp_path, task):
    ws = workspace(tmp_path, task)
    cfg = EnvConfig(max_tool_calls=3)
    log = [{"name": "view", "outside": False}] * 3
    assert detect_flags(task, ws, cfg, log) == []
    assert detect_flags(task, ws, cfg, log + [{"name": "bash", "outside": True}]) == ["outside_read", "tool_spam"]


def test_swebench_grading_applies_the_test_patch(tmp_path):
    repos = tmp_path / "repos"
    repos.mkdir()
    commit = make_repo(repos)
    f = tmp_path / "swe.jsonl"
    f.write_text((FIX / "swebench.jsonl").read_text().replace("{commit}", commit))
    t = load_tasks(f, repos_dir=repos).tasks[0]
    ws = tmp_path / "ws"
    shutil.copytree(task_base_dir(t, tmp_path / "cache"), ws)
    r = grade(t, ws, EnvConfig())
    assert r.value == 0.0 and r.tests == {"tests/test_core.py::test_add": "failed", "tests/test_core.py::test_mul": "passed"}
    subprocess.run(["git", "apply", "-"], input=t.meta["patch"], text=True, cwd=ws, check=True)
    (ws / "tests" / "test_core.py").write_text("def test_mul():\n    pass\n")  # edited test: restored, flagged
    r = grade(t, ws, EnvConfig(cheat_penalty=0.5))
    assert r.components["tests"] == 1.0 and r.flags == ["tests_edited"] and r.value == 0.5
    assert "-    return a - b\n+    return a + b" in workspace_diff(t, ws)


def test_humaneval_grading(tmp_path):
    t = load_tasks(FIX / "humaneval.jsonl").tasks[0]
    assert grade(t, workspace(tmp_path, t), EnvConfig()).value == 0.0
    assert grade(t, workspace(tmp_path, t, **t.solution), EnvConfig()).value == 1.0


def test_parse_junit_and_ids():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_a.TestX" name="test_p[1-2]"/>
      <testcase classname="tests.test_a" name="test_f"><failure message="x"/></testcase>
      <testcase classname="tests.test_a" name="test_e"><error message="x"/></testcase>
      <testcase classname="tests.test_a" name="test_s"><skipped message="x"/></testcase>
      <testcase classname="tests.test_a" name="test_twice"/>
      <testcase classname="tests.test_a" name="test_twice"><error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    rep = parse_junit(xml)
    ids = ["tests/test_a.py::TestX::test_p[1-2]", "tests/test_a.py::test_f", "tests/test_a.py::test_e",
           "tests/test_a.py::test_s", "tests/test_a.py::test_twice", "tests/test_a.py::test_gone"]
    assert statuses_of(ids, rep) == dict(zip(ids, ["passed", "failed", "error", "skipped", "error", "missing"]))
    assert junit_key("a/b/test_c.py::K::test_d") == ("a.b.test_c.K", "test_d")
    with pytest.raises(ValueError, match="not valid XML"):
        parse_junit("<testsuite")
    assert score_tests({"a": "passed", "b": "skipped"}, False) == 0.0
    assert score_tests({"a": "passed", "b": "skipped"}, True) == 0.5
    assert score_tests({}, True) == 0.0


class ScriptedEngine:
    """Replies with fixed text; tests the judge's prompt/parse/weighting logic (the engine is not under test)."""

    def __init__(self, reply: str, tokenizer):
        self.reply, self.tok, self.prompts = reply, tokenizer, []

    async def generate(self, prompt_ids, sampling):
        self.prompts.append(prompt_ids)
        ids = self.tok.encode(self.reply)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), versions=[0] * len(ids))


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class TextChat:
    tokenizer = CharTokenizer()
    stop_token_ids = [0]

    def render(self, messages):
        return self.tokenizer.encode("\n".join(f"{m.role}: {m.content}" for m in messages))


def test_rubric_judge_weights_and_combination(task):
    crit = [("correct", 3.0, "the fix is right"), ("minimal", 1.0, "no unrelated edits")]
    eng = ScriptedEngine("correct: 8\nminimal: 4/10", CharTokenizer())
    judge = RubricJudge(eng, TextChat(), crit)
    s = asyncio.run(judge.score(task, diff="-a\n+b"))
    assert s.scores == {"correct": 0.8, "minimal": 0.4} and s.value == pytest.approx((3 * 0.8 + 0.4) / 4)
    prompt = CharTokenizer().decode(eng.prompts[0])
    assert "correct (weight 3)" in prompt and task.problem in prompt and "+b" in prompt
    s2 = asyncio.run(RubricJudge(ScriptedEngine("I like it", CharTokenizer()), TextChat(), crit).score(task))
    assert s2.value == 0.0 and s2.num_missing == 2
    base = Reward(value=-1.0, components={"tests": 0.0, "penalty": -1.0}, flags=["tests_edited"])
    r = combine(base, s, EnvConfig(test_weight=1.0, rubric_weight=0.5))
    assert r.value == pytest.approx(0.5 * s.value - 1.0) and r.components["rubric"] == s.value
    assert combine(base, RubricScore(1.0, {}, "", 0), EnvConfig(rubric_weight=0.0)).value == -1.0
    assert parse_scores('{"correct": 11, "minimal": -2}', ["correct", "minimal"]) == {"correct": 1.0, "minimal": 0.0}
    for bad in ([], [("x", -1.0, "d")], [("x", 0.0, "d")], [("", 1.0, "d")]):
        with pytest.raises(ValueError):
            RubricJudge(eng, TextChat(), bad)


def test_rubric_judge_through_a_real_local_engine(task):
    """The real path: ChatFormat render -> LocalEngine (tiny random model) -> decode -> parse. A random model
    writes no scores, so the value is 0 with both criteria missing; the plumbing is what is under test."""
    from flywheel.config import ModelConfig
    from flywheel.inference.local import LocalEngine
    from flywheel.policy.chat import ChatFormat
    from flywheel.policy.model import build_model
    from flywheel.policy.tokenizer import default_corpus, train_tokenizer

    tok = train_tokenizer(default_corpus(30_000), 400)
    model = build_model(ModelConfig(preset="tiny", max_seq_len=1024), vocab_size=len(tok))
    judge = RubricJudge(None, ChatFormat(tok), [("correct", 1.0, "right"), ("style", 1.0, "clean")],
                        max_new_tokens=12)

    async def go():
        async with LocalEngine(model, tokenizer=tok) as engine:
            judge.engine = engine
            return await judge.score(task, diff="-    return x\n+    return min(x, hi)\n")

    s = asyncio.run(go())
    assert isinstance(s.text, str) and len(tok.encode(s.text)) <= 12 + 2
    expected = sum(s.scores.values()) / 2
    assert s.value == pytest.approx(expected) and s.num_missing == 2 - len(s.scores)


@pytest.mark.timeout(60)
def test_grading_never_follows_planted_links_or_blocks_on_fifos(tmp_path):
    t = load_tasks(FIX / "flywheel.jsonl").tasks[1]  # pkg/calc.py, tests/test_calc.py, hidden tests/test_hidden.py
    ws = workspace(tmp_path, t, **t.solution)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(ws / "tests")
    (ws / "tests").symlink_to(outside, target_is_directory=True)  # hidden files would land outside
    os.mkfifo(ws / "pkg" / "fifo")
    r = grade(t, ws, EnvConfig())
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert r.components["tests"] == 1.0 and r.flags == ["tests_edited"]  # the visible test file was "deleted"


def test_unsubmitted_withholds_the_positive_part_and_keeps_penalties():
    from flywheel.envs.reward import unsubmitted
    from flywheel.types import Reward

    ok = Reward(1.0, {"tests": 1.0, "penalty": 0.0}, [], {"t": "passed"})
    assert unsubmitted(ok).value == 0.0 and unsubmitted(ok).tests == {"t": "passed"}
    assert unsubmitted(ok).components == {"tests": 1.0, "penalty": 0.0, "not_submitted": 1.0}
    assert ok.components == {"tests": 1.0, "penalty": 0.0}  # the input is not changed
    cheat = Reward(-1.0, {"tests": 0.0, "penalty": -1.0}, ["tests_edited"])
    assert unsubmitted(cheat).value == -1.0 and unsubmitted(cheat).flags == ["tests_edited"]
