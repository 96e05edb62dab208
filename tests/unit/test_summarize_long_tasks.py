"""Long-horizon synthetic tasks (tasks/synth/long.py): deterministic, split by template, graded right, longer than
one easy task's window, and in `chain` mode each test run reveals the next fix. ~5 s."""

import dataclasses
import subprocess
import sys

import pytest

from flywheel.cli import main
from flywheel.config import EnvConfig
from flywheel.envs.verify import verify_task
from flywheel.tasks.loaders import load_tasks
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.tasks.synth.long import generate_long_tasks
from flywheel.tasks.synth.templates import templates_for


def test_deterministic_and_sized_by_config():
    a = generate_long_tasks(3, seed=1, num_files=5, pad_functions=2, kind="spread")
    b = generate_long_tasks(3, seed=1, num_files=5, pad_functions=2, kind="spread")
    assert [t.files for t in a] == [t.files for t in b] and [t.id for t in a] == [t.id for t in b]
    assert [t.problem for t in a] == [t.problem for t in b]
    for t in a:
        assert t.meta["num_files"] == 5 and len(t.meta["modules"]) == 5 and len(t.visible_tests) == 5
        assert all(f"`{m}`" in t.problem for m in t.meta["modules"])  # spread: every fix is listed
    with pytest.raises(ValueError, match="num_files"):
        generate_long_tasks(1, num_files=1)
    with pytest.raises(ValueError, match="kind"):
        generate_long_tasks(1, kind="maze")


def test_held_out_tasks_use_only_held_out_templates():
    held = {t.id for t in templates_for("heldout")}
    train = {t.id for t in templates_for("train")}
    for split, allowed in (("heldout", held), ("train", train)):
        for t in generate_long_tasks(4, seed=2, split=split, num_files=3, kind="chain"):
            assert set(t.meta["function"].split("+")) <= allowed
            assert t.meta["split"] == split


@pytest.mark.parametrize("kind", ["spread", "chain"])
def test_the_fix_of_every_stage_earns_1_and_a_partial_fix_does_not(kind, tmp_path):
    task = generate_long_tasks(1, seed=3, num_files=3, pad_functions=2, kind=kind)[0]
    result = verify_task(task, EnvConfig(grade_cache=0), tmp_path / "v")
    assert result.ok and result.solved == 1.0 and result.untouched < 1.0, result
    first = task.meta["modules"][0]
    partial = dataclasses.replace(task, solution={first: task.solution[first]})
    assert verify_task(partial, EnvConfig(grade_cache=0), tmp_path / "p").solved < 1.0
    calls = oracle_actions(task)
    assert [c.name for c in calls].count("str_replace") == 3 and calls[-1].name == "submit"


def _run_tests(ws):
    out = subprocess.run([sys.executable, "runtests.py", "-q"], cwd=ws, capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def test_chain_reveals_each_next_fix_only_after_the_previous_one(tmp_path):
    task = generate_long_tasks(1, seed=4, num_files=3, pad_functions=1, kind="chain")[0]
    mods = task.meta["modules"]
    assert f"`{mods[0]}`" in task.problem and f"`{mods[1]}`" not in task.problem
    for path, src in task.files.items():
        (tmp_path / path).write_text(src)
    before = _run_tests(tmp_path)
    assert f"fix {mods[0]} first" in before and f"In `{mods[1]}`" not in before
    (tmp_path / mods[0]).write_text(task.solution[mods[0]])
    after = _run_tests(tmp_path)
    assert f"In `{mods[1]}`" in after and f"fix {mods[1]} first" in after and f"In `{mods[2]}`" not in after


def test_a_long_task_needs_several_windows_of_an_easy_one(chat):
    """The oracle's own session (the shortest that solves it) renders to several easy sessions' length."""
    from flywheel.envs.env import CodingEnv
    from flywheel.types import Message

    def oracle_tokens(task, tmp):
        env = CodingEnv(EnvConfig(sandbox="local", tools="core"), tmp)
        ids = chat.render(env.reset(task))
        for call in oracle_actions(task):
            ids += chat.assistant_tokens(Message("assistant", "", tool_calls=[call]))
            obs, _ = env.step([call], [])
            ids += chat.render_observation(obs)
        env.close()
        return len(ids)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        easy = oracle_tokens(generate_tasks(1, seed=5, difficulty="easy")[0], Path(d) / "e")
        long = oracle_tokens(generate_long_tasks(1, seed=5, num_files=4, pad_functions=3)[0], Path(d) / "l")
    assert long > 3 * easy, (long, easy)


def test_cli_writes_long_tasks(tmp_path):
    out = tmp_path / "long.jsonl"
    assert main(["tasks", "synth", "--long", "chain", "--num-files", "3", "--n", "2", "--out", str(out),
                 "--split", "heldout"]) == 0
    tasks = load_tasks(out).tasks
    assert len(tasks) == 2 and all(t.meta["kind"] == "chain" and t.meta["split"] == "heldout" for t in tasks)
