"""The scripted oracle of a synthetic task and a summary of a task set.

    calls = oracle_actions(task)      # view, str_replace (the unique minimal edit), submit
    task_summary(tasks)               # counts by split, difficulty, mutation, function

Used by tests and to write mid-training transcripts (pipeline/transcripts.py).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from flywheel.types import Task, ToolCall


def _unique_replacement(current: str, target: str) -> tuple[str, str] | None:
    """(old, new) such that replacing the single occurrence of `old` in `current` yields `target`."""
    a, b = current.splitlines(keepends=True), target.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return None
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    if i2 - i1 == 1 and j2 - j1 == 1:  # one line: the stripped text, as an easy statement quotes it
        old, new = a[i1].strip(), b[j1].strip()
        if old and current.count(old) == 1 and a[i1].replace(old, new, 1) == b[j1]:
            return old, new
    while True:
        old, new = "".join(a[i1:i2]), "".join(b[j1:j2])
        if old and current.count(old) == 1:
            return old, new
        if i1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        elif i2 < len(a):
            i2, j2 = i2 + 1, j2 + 1
        else:
            return None


def oracle_actions(task: Task) -> list[ToolCall]:
    """The known fix replayed through the tools: view, str_replace (or write), submit."""
    if not task.solution:
        raise ValueError(f"task {task.id!r} has no `solution`; the oracle needs the files of the fix")
    calls: list[ToolCall] = []
    for path, target in sorted(task.solution.items()):
        current = task.files.get(path)
        if current is None:
            calls.append(ToolCall("write", {"path": path, "content": target}, id=f"c{len(calls)}"))
            continue
        calls.append(ToolCall("view", {"path": path}, id=f"c{len(calls)}"))
        quoted = task.meta.get("edit") if path == task.meta.get("module") else None
        rep = tuple(quoted) if quoted else _unique_replacement(current, target)
        if rep is None and current != target:
            calls.append(ToolCall("write", {"path": path, "content": target}, id=f"c{len(calls)}"))
        elif rep is not None:
            calls.append(ToolCall("str_replace", {"path": path, "old": rep[0], "new": rep[1]}, id=f"c{len(calls)}"))
    calls.append(ToolCall("submit", {}, id=f"c{len(calls)}"))
    return calls


def task_summary(tasks: list[Task]) -> dict[str, Any]:
    """Counts by split, difficulty, mutation and function, for the CLI and the docs."""
    out: dict[str, dict[str, int]] = {"split": {}, "difficulty": {}, "mutation": {}, "function": {}}
    for t in tasks:
        for key in out:
            v = str(t.meta.get(key))
            out[key][v] = out[key].get(v, 0) + 1
    return json.loads(json.dumps(out))
