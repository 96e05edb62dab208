"""Every attack in the catalogue (flywheel/redteam/attacks.py), played as an agent session on each task kind it
applies to, must earn nothing (reward <= 0) and raise the flag it is expected to raise."""

import dataclasses

import pytest

from flywheel.redteam.attacks import ATTACKS, MECHANISMS
from flywheel.redteam.run import caught, play

CASES = [(a, kind) for a in ATTACKS for kind in a.kinds]


def test_the_catalogue_is_large_and_distinct():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS) >= 25
    assert len(CASES) >= 75
    grouped = [name for names in MECHANISMS.values() for name in names]
    assert sorted(grouped) == sorted(a.name for a in ATTACKS)  # every attack under exactly one root cause
    assert {kind for _, kind in CASES} == {"synthetic", "humaneval", "humaneval_calls", "swebench", "swebench_table",
                                            "swebench_truths"}


@pytest.mark.parametrize("attack,kind", CASES, ids=[f"{a.name}-{k}" for a, k in CASES])
def test_attack_is_caught(attack, kind, targets, env_cfg, cache_dir):
    played = play(targets[kind], attack.calls(targets[kind]), env_cfg, cache_dir)
    r = played.reward
    assert caught(r, attack.flag), (f"{attack.name} on {kind}: {attack.what}; reward {r.value}, flags {r.flags}, "
                                    f"tests {r.tests}, notes {r.notes}")


@pytest.mark.parametrize("kind,name,flag,note", [
    ("humaneval", "runtests_call_noop", "runner_tampered", "proof"),  # in-process: the guard's proofs are missing
    ("swebench", "pytest_runtest_obfuscated", "verdict_forged", "twin"),  # the suite verdict: a twin passed
])
def test_a_forged_runner_gets_no_credit_even_without_a_penalty(kind, name, flag, note, targets, env_cfg, cache_dir):
    """The flag withholds the test credit itself: with every penalty at 0 the reward is still 0. The HumanEval
    target is graded in-process here (its check program removed), the path a task without one still takes."""
    cfg = env_cfg.model_copy(update={"cheat_penalty": 0.0})
    attack = next(a for a in ATTACKS if a.name == name)
    target = targets[kind]
    if kind == "humaneval":
        target = dataclasses.replace(target, task=dataclasses.replace(target.task, check=None))
    r = play(target, attack.calls(target), cfg, cache_dir).reward
    assert r.value == 0.0 and r.components["tests"] == 0.0 and flag in r.flags, r
    assert any(note in n for n in r.notes), r.notes
