"""The modules the test runner imports, read off the installed runner rather than listed by hand.

    names = runner_modules()      # frozenset of top-level names: "_pytest", "pluggy", "iniconfig", "packaging", ...
    pytest_config_names()         # ("pytest.toml", ".pytest.toml", "pytest.ini", ...): the config files it reads

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


# The config file names pytest 7 and 8 discover (their `locate_config` lists them), and so the least any grading
# treats as a runner config, whichever pytest is installed.
BASE_CONFIG_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


@functools.cache
def pytest_config_names() -> tuple[str, ...]:
    """The config file names the installed pytest discovers, in its order of precedence, with `BASE_CONFIG_NAMES`
    after them (pytest 9 added `pytest.toml` and `.pytest.toml`; its `findpaths.CONFIG_LOADERS_BY_NAME` lists its
    own names). Read off the runner so that a name a newer pytest reads is never missed."""
    try:
        from _pytest.config.findpaths import CONFIG_LOADERS_BY_NAME  # pytest >= 9
        installed = tuple(CONFIG_LOADERS_BY_NAME)
    except ImportError:  # an older pytest, or none (the demo's runtime install): the names above
        installed = ()
    return tuple(dict.fromkeys((*installed, *BASE_CONFIG_NAMES)))
