"""The modules the test runner imports, read off the installed runner rather than listed by hand.

    names = runner_modules()      # frozenset of top-level names: "_pytest", "pluggy", "iniconfig", "packaging", ...

Why: a file in the workspace named like a module the runner imports while it starts or collects, placed on the
import path the tests run with, replaces that module for the whole test process. A hand-written list misses what
another pytest version imports; this runs `pytest --collect-only` on an empty directory once per process, in a
child interpreter (the run's own Python, the one grading's sandboxes run unless a task has its own environment),
and takes every top-level module name it left in `sys.modules`. envs/integrity.py `shadows` uses the set.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile

_MARK = "FLYWHEEL-RUNNER-MODULES "
_CODE = f"""
import json, sys, pytest
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", sys.argv[1]])
print({_MARK!r} + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""


@functools.cache
def runner_modules() -> frozenset[str]:
    """Top-level names of the modules a pytest run imports here (empty when pytest is not installed)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-runner-") as empty:
        r = subprocess.run([sys.executable, "-I", "-c", _CODE, empty], capture_output=True, text=True, timeout=120,
                           cwd=empty, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"})
    for line in r.stdout.splitlines():
        if line.startswith(_MARK):
            return frozenset(json.loads(line[len(_MARK):])) - {"__main__", "__mp_main__"}
    return frozenset()
