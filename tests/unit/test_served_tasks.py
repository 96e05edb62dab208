"""Tasks whose hidden tests are served by a per-session service (`tasks/served.py`), graded through the real path:
a synthetic task's fix earns 1 and its untouched tree 0 as in the original task, the same fix earns 0 once the
service is gone (the verdict rests on the live service), and nothing of the service is left after the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.sandbox import netns, services
from flywheel.sandbox.host import kill_uid
from flywheel.sandbox.sandbox import flush_closed
from flywheel.sandbox.services import parse_services
from flywheel.tasks.loaders import parse_flywheel, task_to_dict
from flywheel.tasks.served import serve_hidden_tests, survivors
from flywheel.tasks.synth import generate_tasks
from flywheel.types import Task, ToolCall

needs_services = pytest.mark.skipif(not services.available(), reason="needs root, network namespaces and bubblewrap")


def _task() -> tuple[Task, Task]:
    original = generate_tasks(1, seed=5, split="train", difficulty="easy")[0]
    return original, serve_hidden_tests(original)


def test_the_hidden_tests_leave_the_task_for_its_service() -> None:
    original, served = _task()
    assert served.problem == original.problem and served.files == original.files
    assert served.fail_to_pass == original.fail_to_pass and served.pass_to_pass == original.pass_to_pass
    moved = served.meta["served_tests"]
    assert moved and all(original.hidden_files[p] not in served.hidden_files[p] for p in moved)
    assert parse_services(served.services)[0].ready_port is not None
    assert parse_flywheel(task_to_dict(served)).services == served.services  # a task file line keeps it


def test_bad_input_says_what_to_change() -> None:
    original, served = _task()
    with pytest.raises(ValueError, match="already declares a service on port"):
        serve_hidden_tests(served)
    with pytest.raises(ValueError, match="no hidden test files"):
        serve_hidden_tests(Task(id="bare", problem="p", files={"a.py": ""}))


@needs_services
def test_served_task_grades_like_the_original_only_while_its_service_lives(tmp_path: Path) -> None:
    original, served = _task()
    assert original.solution is not None
    fix = [ToolCall("write", {"path": p, "content": text}) for p, text in original.solution.items()]

    def session(task: Task, calls: list[ToolCall], kill_service: bool = False) -> float:
        with CodingEnv(EnvConfig(), tmp_path / "cache") as env:
            env.reset(task)
            for c in calls:
                env.step([c])
            if kill_service:
                assert env.services is not None
                for svc in env.services.running:
                    kill_uid(svc.uid)
            return env.grade().value

    assert session(original, fix) == 1.0 and session(original, []) == 0.0
    namespaces = netns.held_by_this_process()
    assert session(served, fix) == 1.0
    assert session(served, []) == 0.0
    assert session(served, fix, kill_service=True) == 0.0  # the hidden tests come only from the live service
    flush_closed()
    assert survivors() == [] and netns.held_by_this_process() == namespaces  # each session's namespace closed
