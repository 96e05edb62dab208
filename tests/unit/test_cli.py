import subprocess
import sys
import time


def test_help_is_fast_and_imports_no_torch():
    code = "import sys; from flywheel.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "flywheel.cli", "--help"], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0 and "bench" in res.stdout
    assert elapsed < 3.0  # one second on an idle machine; the bound leaves room for a loaded CI box



def test_tasks_check_grade_finds_a_test_command_the_guard_cannot_work_with(tmp_path, capsys):
    """`python -I` ignores PYTHONPATH (and the workspace on sys.path), so the grading guard never starts and
    every solution would grade 0. `flywheel tasks check --grade` shows it before a run does."""
    import dataclasses

    from flywheel.cli import main
    from flywheel.tasks.loaders import save_tasks
    from flywheel.tasks.synth import generate_tasks

    good = generate_tasks(2, seed=5, split="train", difficulty="easy")
    # graded by its test command (a task without calls: the in-process path), not by data
    bad = dataclasses.replace(good[1], id="isolated", test_command="python -I runtests.py -q", calls=[])
    save_tasks([good[0], bad], tmp_path / "t.jsonl")
    assert main(["tasks", "check", str(tmp_path / "t.jsonl"), "--grade"]) == 1
    out = capsys.readouterr().out
    assert "grades wrong: isolated: solution 0.0" in out and "2 solutions graded, 1 wrong" in out
    # which path graded each: the synthetic task by data, the one without calls in-process
    assert "verdicts: 1 data verdict (calls compared by the grader), 1 the guarded in-process path alone" in out


def test_verdict_kinds_name_the_path_that_graded():
    from flywheel.envs.verify import VerifyResult, verdict_kind, verdict_summary
    kinds = [verdict_kind(c) for c in ({"data_verdict": 1.0, "tests": 1.0}, {"suite_verdict": 1.0, "twins": 2.0},
                                       {"suite_verdict": 1.0, "untwinned": 3.0, "guarded_untwinned": 1.0},
                                       {"in_process_verdict": 1.0, "untwinned": 2.0}, {"tests_not_run": 1.0})]
    assert kinds == ["data", "suite", "suite+guard", "in-process", ""]
    results = [VerifyResult(f"t{i}", 1.0, 0.0, [], 0.1, verdict=k) for i, k in enumerate(kinds + ["suite"])]
    assert verdict_summary(results) == ("verdicts: 1 data verdict (calls compared by the grader), 2 suite verdict, "
                                        "every FAIL_TO_PASS test with a twin, 1 suite verdict, some FAIL_TO_PASS tests "
                                        "without a twin (those also through the guard), 1 the guarded in-process path "
                                        "alone (no twin; the code under test can reach the guard)")


def test_require_twins_needs_verify(capsys):
    from flywheel.cli import main
    assert main(["tasks", "mine", "--dir", "x=/nonexistent", "--out", "/tmp/never.jsonl", "--require-twins"]) == 2
    assert "add --verify" in capsys.readouterr().out
