"""Grading from changes (no Ray): a rebuilt workspace grades exactly like the agent's own; the grader pool's
dispatch and retry rule; RayRollouts.get collecting every ready future in one pass.

    .venv/bin/python -m pytest -q tests/unit/test_remote_grading.py

Workspaces are real sandboxes over real task bases and are graded by the real `reward.grade` twice: on the
sandbox's workspace (what the local backend does) and rebuilt from `capture_changes` in another directory (what
a grader actor does). The pool and `get` tests use fake actor handles and a fake `ray` module: they test the
order of events only (the real actors are in tests/integration/test_ray.py).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import ray.exceptions as rex  # the real exception classes (Ray is in the dev extra; nothing is started)

from flywheel.config import EnvConfig
from flywheel.envs.changes import Changes, RebuildGrader, apply_changes, capture_changes
from flywheel.envs.env import CodingEnv
from flywheel.envs.reward import grade
from flywheel.orchestrator.grader import GraderPool
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.tasks.loaders import load_tasks, task_base_dir
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.types import Reward, ToolCall

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"
FIXED = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"


def _same(a: Reward, b: Reward) -> None:
    """Equal rewards; either may come from the grade cache (a byte-identical restored tree, the strongest sign
    that the rebuild reproduced the workspace)."""
    def ran(r: Reward) -> dict[str, float]:
        return {k: v for k, v in r.components.items() if k != "tests_cached"}
    assert (a.value, ran(a), a.flags, a.tests) == (b.value, ran(b), b.flags, b.tests)


def _both(task, edit, tmp_path: Path, cfg: EnvConfig | None = None, tool_log=()) -> tuple[Reward, Reward, Changes]:
    """Grade one edited sandbox workspace in place and rebuilt from its changes (another cache dir)."""
    cfg = cfg or EnvConfig()
    base = task_base_dir(task, tmp_path / "engine-cache")
    with create_sandbox(base, SandboxLimits.from_config(cfg), kind=cfg.sandbox) as sb:
        ws = Path(sb.workspace)
        edit(ws)
        local = grade(task, ws, cfg, tool_log=list(tool_log), kind=cfg.sandbox)
        changes = capture_changes(base, ws)
    remote = RebuildGrader(cfg, tmp_path / "grader-cache").grade(task, changes, list(tool_log))
    return local, remote, changes


@pytest.fixture()
def task():
    return load_tasks(FIX / "flywheel.jsonl").tasks[0]  # calc.py, test_calc.py, hidden test_hidden.py


def test_fixed_and_unfixed_workspaces_grade_the_same_rebuilt(tmp_path, task):
    local, remote, ch = _both(task, lambda ws: (ws / "calc.py").write_text(FIXED), tmp_path)
    _same(local, remote)
    assert remote.value == 1.0 and remote.flags == []
    assert list(ch.files) == ["calc.py"] and ch.files["calc.py"][0] == FIXED.encode() and not ch.deleted
    local, remote, ch = _both(task, lambda ws: None, tmp_path)
    _same(local, remote)
    assert remote.value == 0.0 and remote.tests["test_hidden.py::test_high"] == "failed"
    assert ch == Changes()  # nothing changed, nothing travels


def test_test_editing_workspace_grades_the_same_rebuilt(tmp_path, task):
    def cheat(ws: Path) -> None:
        (ws / "calc.py").write_text(FIXED)
        (ws / "test_calc.py").write_text("def test_low():\n    assert True\n")
        (ws / "conftest.py").write_text("def pytest_collection_modifyitems(items):\n    items.clear()\n")

    local, remote, ch = _both(task, cheat, tmp_path, cfg=EnvConfig(flag_penalties={"tests_edited": 0.25}),
                              tool_log=[{"name": "bash", "outside": True}])
    _same(local, remote)
    assert remote.flags == ["tests_edited", "conftest_added", "outside_read"] and remote.components["tests"] == 1.0
    assert sorted(ch.files) == ["calc.py", "conftest.py", "test_calc.py"]


def test_file_deleting_workspace_grades_the_same_rebuilt(tmp_path):
    t = load_tasks(FIX / "flywheel.jsonl").tasks[1]  # pkg/calc.py, tests/test_calc.py, hidden tests/test_hidden.py

    def delete_tests(ws: Path) -> None:
        for rel, text in t.solution.items():
            (ws / rel).write_text(text)
        for p in sorted((ws / "tests").rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
        (ws / "tests").rmdir()

    local, remote, ch = _both(t, delete_tests, tmp_path)
    _same(local, remote)
    assert remote.components["tests"] == 1.0 and remote.flags == ["tests_edited"]
    assert ch.deleted[0] == "tests" and "tests/test_calc.py" in ch.deleted  # the tree, parents first

    def delete_solution(ws: Path) -> None:
        (ws / "pkg" / "calc.py").unlink()

    local, remote, ch = _both(t, delete_solution, tmp_path)
    _same(local, remote)
    assert remote.value == 0.0 and ch.deleted == ["pkg/calc.py"]


def test_links_modes_and_empty_dirs_travel(tmp_path, task):
    """What text-only changes would lose: a symlink (here it *is* the fix), an exec bit, an empty directory."""
    def edit(ws: Path) -> None:
        (ws / "fixed_impl.py").write_text(FIXED)
        (ws / "calc.py").unlink()
        (ws / "calc.py").symlink_to("fixed_impl.py")
        (ws / "tool.sh").write_text("#!/bin/sh\necho hi\n")
        os.chmod(ws / "tool.sh", 0o755)
        (ws / "data" / "empty").mkdir(parents=True)
        (ws / "__pycache__").mkdir(exist_ok=True)  # skipped, as grading skips it
        (ws / "__pycache__" / "x.pyc").write_bytes(b"\0")

    local, remote, ch = _both(task, edit, tmp_path)
    _same(local, remote)
    assert remote.value == 1.0
    assert ch.links == {"calc.py": "fixed_impl.py"} and ch.deleted == ["calc.py"]
    assert ch.files["tool.sh"][1] == 0o755 and ch.dirs == ["data", "data/empty"]
    root = tmp_path / "copy"
    root.mkdir()
    apply_changes(root, ch)
    assert os.readlink(root / "calc.py") == "fixed_impl.py" and os.access(root / "tool.sh", os.X_OK)
    assert (root / "data" / "empty").is_dir() and not (root / "__pycache__").exists()


def test_bad_changes_are_rejected(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "outside.txt"  # an absolute path the test owns: a broken check
    root.mkdir()                                                # deletes that, never a file of the machine's
    outside.write_text("keep")
    with pytest.raises(ValueError, match="inside the workspace"):
        apply_changes(root, Changes(files={"../escape.py": (b"x", 0o644)}))
    with pytest.raises(ValueError, match="inside the workspace"):
        apply_changes(root, Changes(deleted=[str(outside)]))
    assert outside.read_text() == "keep"
    with pytest.raises(TypeError, match="Changes"):
        apply_changes(root, {"files": {}})
    assert not (tmp_path / "escape.py").exists()


def test_coding_env_with_a_grader_gives_the_in_process_rewards(tmp_path):
    """A full session through CodingEnv: default grading vs a grader given the changes (oracle, cheat, nothing)."""
    task = generate_tasks(1, seed=6, difficulty="easy")[0]
    sessions = [oracle_actions(task), [ToolCall("write", {"path": task.visible_tests[0], "content": "x = 1\n"}),
                                       ToolCall("submit", {})], [ToolCall("submit", {})]]
    seen: list[Changes] = []
    rebuild = RebuildGrader(EnvConfig(), tmp_path / "grader-cache")

    def grader(t, changes, tool_log):
        seen.append(changes)
        return rebuild.grade(t, changes, tool_log)

    rewards = []
    for grader_or_none in (None, grader):
        with CodingEnv(EnvConfig(), tmp_path / "cache", grader=grader_or_none) as env:
            for actions in sessions:
                env.reset(task)
                for call in actions:
                    if env.step([call])[1]:
                        break
                rewards.append(env.grade())
    for a, b in zip(rewards[:3], rewards[3:]):
        _same(a, b)
    assert [r.value for r in rewards[3:]] == [1.0, -1.0, 0.0] and len(seen) == 3


# ------------------------------------------------------------------ GraderPool (fake handles, real exceptions)


class _Ref:
    def __init__(self, fn):
        self.fn = fn


class _FakeRay:
    exceptions = rex

    def __init__(self):
        self.num_waits = 0

    @staticmethod
    def get(ref, timeout=None):
        return ref.fn()

    @staticmethod
    def cancel(ref, force=False):
        pass


class _Handle:
    """A grader actor: `.grade.remote(...)` returns a ref; `dead` makes the call fail as a killed actor's does."""

    def __init__(self, name: str, log: list, dead: bool = False, hold: threading.Event | None = None):
        self.name, self.log, self.dead, self.hold = name, log, dead, hold
        self.grade = self

    def remote(self, task, changes, tool_log):
        def run():
            self.log.append(self.name)
            if self.dead:
                raise rex.ActorDiedError()
            if self.hold is not None:
                self.hold.wait(5)
            return Reward(value=1.0, components={"by": float(self.name[-1])})
        return _Ref(run)


def test_pool_round_robins_and_retries_a_dead_grader_elsewhere():
    log: list[str] = []
    fallback_calls = []
    handles = [_Handle("g0", log), _Handle("g1", log, dead=True), _Handle("g2", log)]
    pool = GraderPool(handles, fallback=lambda *a: fallback_calls.append(a) or Reward(0.5), ray_module=_FakeRay())
    rewards = [pool.grade(None, Changes(), []) for _ in range(4)]
    # g0; then g1 dies -> retried on g2; g1 is now down, so g0, g2 take turns
    assert log == ["g0", "g1", "g2", "g0", "g2"]
    assert [r.components["by"] for r in rewards] == [0.0, 2.0, 0.0, 2.0]
    assert pool.stats() == {"rollout/graded_remote": 4.0, "rollout/grader_retries": 1.0,
                            "rollout/graded_fallback": 0.0, "rollout/graders_up": 2.0}
    assert fallback_calls == []


def test_pool_grades_in_process_when_every_grader_is_dead():
    log: list[str] = []
    pool = GraderPool([_Handle("g0", log, dead=True), _Handle("g1", log, dead=True)],
                      fallback=lambda t, ch, tl: Reward(0.25), ray_module=_FakeRay(), down_s=60)
    assert pool.grade(None, Changes(), []).value == 0.25  # never a lost session
    assert pool.grade(None, Changes(), []).value == 0.25 and log == ["g0", "g1"]  # down graders are not re-tried
    s = pool.stats()
    assert s["rollout/grader_retries"] == 2.0 and s["rollout/graded_fallback"] == 2.0 and s["rollout/graders_up"] == 0.0


def test_pool_sends_to_the_least_loaded_grader():
    log: list[str] = []
    hold = threading.Event()
    pool = GraderPool([_Handle("g0", log, hold=hold), _Handle("g1", log)], fallback=lambda *a: Reward(0.0),
                      ray_module=_FakeRay())
    busy = threading.Thread(target=pool.grade, args=(None, Changes(), []))
    busy.start()
    deadline = time.monotonic() + 5
    while log != ["g0"] and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.grade(None, Changes(), [])
    pool.grade(None, Changes(), [])  # g0 still busy: both go to g1 although round robin would pick g0
    hold.set()
    busy.join(5)
    assert log == ["g0", "g1", "g1"]


# ------------------------------------------------------------------ RayRollouts.get (fake ray: order of events)


class _Future:
    def __init__(self, name: str, ready: bool = True, dead: bool = False, num_sessions: int = 0):
        self.name, self.ready, self.dead, self.num_sessions = name, ready, dead, num_sessions


class _PoolRay:
    exceptions = rex

    def __init__(self):
        self.waits: list[tuple[int, float]] = []
        self.killed: list = []

    def wait(self, refs, num_returns=1, timeout=None):
        self.waits.append((num_returns, timeout))
        ready = [r for r in refs if r.ready][:num_returns]
        return ready, [r for r in refs if r not in ready]

    @staticmethod
    def get(ref, timeout=None):
        if ref.dead:
            raise rex.ActorDiedError()
        return [ref.name], {"node/version": 1, "rollout/sessions": float(ref.num_sessions)}

    def kill(self, actor):
        self.killed.append(actor)


class _EngineHandle:
    def __init__(self, name):
        self.name, self.submitted = name, []
        self.run_group = self

    def remote(self, task_index, seed, group_id, min_version):
        self.submitted.append(group_id)
        return _Future(group_id, ready=False)


def test_get_collects_every_ready_future_in_one_pass(tmp_path, monkeypatch):
    from flywheel.config import FlywheelConfig
    from flywheel.orchestrator import ray as ray_backend
    from flywheel.orchestrator.node import NodeSpec

    fake = _PoolRay()
    monkeypatch.setattr(ray_backend, "_ray", lambda: fake)
    cfg = FlywheelConfig.model_validate({"orchestrator": {"mode": "sync"}})
    spec = NodeSpec(config={}, model_dir="", tokenizer_dir="", tasks=generate_tasks(1, seed=1), store_url=str(tmp_path),
                    cache_dir=str(tmp_path / "cache" / "node0"))
    pool = ray_backend.RayRollouts([spec], cfg, run_dir=tmp_path)
    h0, h1 = _EngineHandle("e0"), _EngineHandle("e1")
    e0 = ray_backend.Engine(0, "default", spec, h0)
    e1 = ray_backend.Engine(1, "default", spec, h1)
    pool.engines = {0: e0, 1: e1}

    def job(gid):
        return ray_backend.Job(0, 1, gid, attempts=1)

    # submission order is not completion order: "c" finished before "b" (its engine had done fewer sessions)
    for name, ready, num in [("a", True, 4), ("b", True, 12), ("c", True, 8), ("slow", False, 0)]:
        e0.inflight[_Future(name, ready, num_sessions=num)] = job(name)
    for name, ready, dead in [("d", True, False), ("lost1", True, True), ("lost2", False, False)]:
        e1.inflight[_Future(name, ready, dead, num_sessions=20)] = job(name)

    first = pool.get(timeout_s=1.0)
    assert fake.waits == [(1, 1.0), (6, 0)]  # one blocking wait for the first, the rest taken at once
    assert first == ("group", 0, ["a"], {"node/version": 1, "rollout/sessions": 4.0})
    # engine 1 died: handled in that same pass — its finished group kept, its other two re-queued to engine 0
    assert fake.killed == [h1] and list(pool.engines) == [0]
    assert pool.counters["engines_died"] == 1 and pool.counters["requeued"] == 2 and pool.counters["groups"] == 4
    assert sorted(h0.submitted) == ["lost1", "lost2"]
    rest = [pool.get(timeout_s=1.0) for _ in range(3)]
    assert [(m[1], m[2]) for m in rest] == [(0, ["c"]), (0, ["b"]), (1, ["d"])]  # oldest stats first
    assert e0.stats["rollout/sessions"] == 12.0  # the engine's newest figures
    assert len(fake.waits) == 2  # queued groups come out without another wait
    assert pool.get(timeout_s=0.5) is None and fake.waits[-1] == (1, 0.5)  # nothing ready: one wait, None


@pytest.mark.parametrize("mode, expected", [("async", 8), ("sync", 0)])
def test_async_pool_queues_a_second_round_of_groups_on_each_engine(tmp_path, monkeypatch, mode, expected):
    """The driver hands out work only between trainer steps, so in async mode each engine holds as many groups
    again as it runs; sync mode runs exactly what was requested (nothing here)."""
    from flywheel.config import FlywheelConfig
    from flywheel.orchestrator import ray as ray_backend
    from flywheel.orchestrator.node import NodeSpec

    monkeypatch.setattr(ray_backend, "_ray", lambda: _PoolRay())
    cfg = FlywheelConfig.model_validate({"orchestrator": {"mode": mode}})
    spec = NodeSpec(config={}, model_dir="", tokenizer_dir="", tasks=generate_tasks(3, seed=1), store_url=str(tmp_path),
                    cache_dir=str(tmp_path / "cache" / "node0"), max_groups_in_flight=4)
    pool = ray_backend.RayRollouts([spec], cfg, run_dir=tmp_path)
    handle = _EngineHandle("e0")
    pool.engines = {0: ray_backend.Engine(0, "default", spec, handle)}
    pool._fill()
    assert len(handle.submitted) == expected
