"""The final diff of a session, replayed from its edit calls on the task's files.

    tasks = RunTasks(Path("runs/demo"), config)        # the run's tasks/*.jsonl (and config `tasks`), read on demand
    out = replay_diff(tasks.get("synth-train-3-easy-00000"), view)   # {"diff", "exact", "note"}

Why replayed: a trajectory keeps tokens, not the workspace, and the run directory keeps the tasks. The harness's
`str_replace` (the old text must occur exactly once) and `write` are pure functions of the file's text, so replaying
the session's calls in order on the task's files gives the workspace they left — the same unified diff format as
`envs.reward.workspace_diff`. A session that also ran shell commands (`bash`) may have changed files a replay cannot
see: the diff is then marked as not exact. Tasks that live in a git repository (no `files`) are not replayed.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from flywheel.tasks.loaders import load_tasks
from flywheel.types import Task

PURE_TOOLS = ("view", "str_replace", "write", "run_tests", "search", "submit")  # none changes files otherwise
MAX_DIFF_CHARS = 20_000


class RunTasks:
    """The tasks a run trained and evaluated on, loaded the first time one is asked for."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        self.run_dir, self.config = run_dir, config
        self._loaded: list[tuple[Path, int]] | None = None  # the files (and sizes) the tasks were read from
        self._tasks: dict[str, Task] = {}

    def _files(self) -> list[tuple[Path, int]]:
        paths = sorted((self.run_dir / "tasks").glob("*.jsonl"))
        paths += [Path(self.config[k]) for k in ("tasks", "eval_tasks")
                  if isinstance(self.config.get(k), str) and self.config[k] and Path(self.config[k]).is_file()]
        return [(p, p.stat().st_size) for p in paths if p.exists()]

    def get(self, task_id: str) -> Task | None:
        """The task, or None; a miss re-reads the task files if they changed (a job writes them as it starts)."""
        if task_id not in self._tasks and (self._loaded is None or self._files() != self._loaded):
            self._loaded = self._files()
            self._tasks = {}
            for path, _ in self._loaded:
                try:
                    self._tasks.update({t.id: t for t in load_tasks(path).tasks})
                except (OSError, ValueError):  # an unreadable task file: no diff for its tasks
                    continue
        return self._tasks.get(task_id)


def _calls(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for s in view["segments"] for t in s["turns"] if t["role"] == "assistant" for c in t.get("tool_calls", [])]


def replay_diff(task: Task | None, view: dict[str, Any]) -> dict[str, Any]:
    """The unified diff the session's edit calls leave on `task`'s files (see the module docstring)."""
    if task is None:
        return {"diff": None, "exact": False, "note": "the run directory holds no task file with this task"}
    if not task.files:
        return {"diff": None, "exact": False, "note": "a repository task: its files are not in the task file"}
    files = dict(task.files)
    shell = False
    for call in _calls(view):
        args = call.get("arguments") or {}
        path = args.get("path")
        if call["name"] == "str_replace" and isinstance(path, str) and path in files:
            old, new = args.get("old"), args.get("new")
            if isinstance(old, str) and isinstance(new, str) and old and files[path].count(old) == 1:
                files[path] = files[path].replace(old, new, 1)
        elif call["name"] == "write" and isinstance(path, str) and isinstance(args.get("content"), str):
            files[path] = args["content"]
        elif call["name"] not in PURE_TOOLS:
            shell = True
    parts: list[str] = []
    for rel in sorted(files):
        old = task.files.get(rel)
        if old is None:
            parts += difflib.unified_diff([], files[rel].splitlines(True), "/dev/null", f"b/{rel}")
        elif old != files[rel]:
            parts += difflib.unified_diff(old.splitlines(True), files[rel].splitlines(True), f"a/{rel}", f"b/{rel}")
    text = "".join(parts)
    if len(text) > MAX_DIFF_CHARS:
        text = text[:MAX_DIFF_CHARS] + "\n[... diff cut in this view ...]\n"
    note = ("replayed from the session's edit calls; it also ran shell commands, whose changes a replay cannot see"
            if shell else "replayed from the session's edit calls on the task's files")
    return {"diff": text, "exact": not shell, "note": note}
