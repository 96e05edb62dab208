"""Legitimate fixes, applied the ways agents apply them, must earn reward 1 and raise no flag."""

import pytest

from flywheel.redteam.legit import variants
from flywheel.redteam.run import play

TARGETS = ["swebench", "swebench_table", "swebench_truths", "humaneval", "humaneval_calls", *(f"synthetic-{i}" for i in range(8))]


def target_of(label, targets, synthetic):
    return synthetic[int(label.split("-")[1])] if label.startswith("synthetic") else targets[label]


def test_there_are_enough_variants(targets, synthetic):
    all_cases = [(name, t) for label in TARGETS for t in [target_of(label, targets, synthetic)] for name in variants(t)]
    assert {"git_apply_heredoc", "python_heredoc_tmp", "helper_module", "own_test_file", "patch_from_tmp",
            "version_bump"} <= {name for name, _ in all_cases}
    assert len(all_cases) >= 60  # with the 164 official HumanEval solutions (test_humaneval.py): over 200


@pytest.mark.parametrize("label", TARGETS)
def test_legitimate_fixes_get_full_reward_and_no_flag(label, targets, synthetic, env_cfg, cache_dir):
    target = target_of(label, targets, synthetic)
    wrong = []
    for name, calls in variants(target).items():
        played = play(target, calls, env_cfg, cache_dir)
        r = played.reward
        if r.value != 1.0 or r.flags:
            outside = [e.get("outside_refs") for e in played.tool_log if e.get("outside")]
            wrong.append(f"{name}: reward {r.value}, flags {r.flags}, tests {r.tests}, notes {r.notes}, "
                         f"outside refs {outside}")
    assert not wrong, f"{target.kind} {target.task.id}:\n" + "\n".join(wrong)
