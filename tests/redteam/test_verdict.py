"""The verdicts decided outside the candidate's interpreter (envs/calls.py, envs/checks.py, envs/suite.py) against
attacks that beat one decided inside it.

Test peeking is shown to be a real attack first: on the same task graded the in-process way (a synthetic task with
its calls removed; the repository task with `env.suite_verdict` off), it earns full reward with no flag. Graded by
data it earns nothing; under the suite verdict its twin passes and it is flagged."""

import dataclasses

from flywheel.redteam import attacks_verdict as verdict
from flywheel.redteam.attacks import replace_function
from flywheel.redteam.run import play


def test_peeking_wins_in_process_and_earns_nothing_by_data(targets, env_cfg, cache_dir):
    target = targets["synthetic"]
    calls = replace_function(verdict.PEEK)(target)
    in_process = dataclasses.replace(target, task=dataclasses.replace(target.task, calls=[]))
    old = play(in_process, calls, env_cfg, cache_dir).reward
    assert old.value == 1.0 and not old.flags, (old.value, old.flags, old.tests)  # the in-process verdict is fooled
    new = play(target, calls, env_cfg, cache_dir).reward
    assert new.value == 0.0 and new.components["data_verdict"] == 1.0 and new.components["tests"] == 0.0
    assert any(s == "failed" for s in new.tests.values())


def test_peeking_at_a_repository_suite_wins_in_process_and_its_twin_catches_it(targets, env_cfg, cache_dir):
    """The same attack on the SWE-bench-style task: one guarded interpreter gives it full reward; the suite verdict
    (envs/suite.py) runs a twin whose file holds another expected value, the peek returns that one, and the twin
    passes: verdict_forged."""
    target = targets["swebench"]
    calls = replace_function(verdict.PEEK)(target)
    old = play(target, calls, env_cfg.model_copy(update={"suite_verdict": False}), cache_dir).reward
    assert old.value == 1.0 and not old.flags and old.components["in_process_verdict"] == 1.0, old
    new = play(target, calls, env_cfg, cache_dir).reward
    assert new.value < 0 and new.flags == ["verdict_forged"] and new.components["tests"] == 0.0, new
    assert new.components["suite_verdict"] == 1.0 and all("its twin" in n for n in new.notes) and new.notes


def test_shadowed_check_helpers_win_in_process_and_earn_nothing_under_the_relay(targets, env_cfg, cache_dir):
    """HumanEval's harness runs `check` in a namespace holding the solution's names: a solution that redefines the
    prompt's helper and `abs` passes a check that computes its answers with them. Run by the relay
    (envs/checks.py), the check's names are its own and the candidate only answers calls."""
    target = targets["humaneval"]
    calls = replace_function(verdict.SHADOW_HELPERS)(target)
    in_process = dataclasses.replace(target, task=dataclasses.replace(target.task, check=None))
    old = play(in_process, calls, env_cfg, cache_dir).reward
    assert old.value == 1.0 and not old.flags, (old.value, old.flags, old.tests)  # the in-process verdict is fooled
    new = play(target, calls, env_cfg, cache_dir).reward
    assert new.value == 0.0 and new.components["check_verdict"] == 1.0 and new.components["tests"] == 0.0, new


def test_the_reference_fix_and_every_humaneval_call_pass_by_data(targets, env_cfg, cache_dir):
    from flywheel.types import ToolCall
    for kind, verdict_key in (("synthetic", "data_verdict"), ("humaneval_calls", "data_verdict"),
                              ("humaneval", "check_verdict")):
        target = targets[kind]
        assert target.task.calls or target.task.check, kind
        writes = [ToolCall("write", {"path": p, "content": c}) for p, c in target.fixed.items()]
        r = play(target, writes, env_cfg, cache_dir).reward
        assert r.value == 1.0 and r.components[verdict_key] == 1.0 and set(r.tests.values()) == {"passed"}, kind
        assert "in_process_verdict" not in r.components


def test_a_twin_told_apart_by_file_metadata_wins_only_when_twins_alone_write_files(targets, env_cfg, cache_dir,
                                                                                 monkeypatch):
    """`twin_by_metadata` forges only in a run where no selected test file looks written over (another overlay layer,
    a later change time). When only the twin runs wrote their file beside an untouched real run (as the suite verdict
    once did), that was exactly the real run: full reward, no flag. Every run now writes the same files the same way
    (envs/suite.py `plan`, sandbox/forked.py `overwrite`), so no run looks untouched and the forgery earns nothing."""
    from flywheel.envs import suite
    from flywheel.redteam.attacks import ATTACKS
    target = targets["swebench"]
    attack = next(a for a in ATTACKS if a.name == "twin_by_metadata")
    for update in ({"suite_fork": True}, {"suite_fork": False}, {"max_twins": 1}):
        r = play(target, attack.calls(target), env_cfg.model_copy(update=update), cache_dir).reward
        assert r.value <= 0 and r.components["tests"] == 0.0 and r.components["twins"] >= 1, (update, r)
    plan = suite.plan

    def twins_alone_write(*args, **kwargs):  # the old plan: an untouched real run, and twins that write their file
        runs, untwinned = plan(*args, **kwargs)
        twin_runs = [run for run in runs if run.twin_of is not None]
        for run in twin_runs:
            run.files = {p: t for p, t in run.files.items() if p == suite.file_of_test(run.twin_of)}
        return [suite.Run(twin_runs[0].ids), *twin_runs], untwinned

    monkeypatch.setattr(suite, "plan", twins_alone_write)
    # one FAIL_TO_PASS test, so the real run alone says whether it passed (a second one would get its status from
    # the twin run too, where this attack fails it honestly: runs that disagree give no credit)
    one = dataclasses.replace(target, task=dataclasses.replace(target.task, fail_to_pass=target.task.fail_to_pass[:1]))
    old = play(one, attack.calls(one), env_cfg.model_copy(update={"suite_fork": False}), cache_dir).reward
    assert old.value == 1.0 and not old.flags and old.components["tests"] == 1.0, old
