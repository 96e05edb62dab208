"""The transformers floor pyproject.toml declares (`transformers>=5.0`) is one the code runs on.

    make setup      # installs the floor (Makefile, FLOOR) into .venv/floor, without dependencies

A child pytest runs with .venv/floor first on its path, so it imports transformers 5.0.0 (and the hub and tokenizers
that release pins) instead of the installed one, and runs the tests of the code that calls transformers: every
family's native runner against its HF forward and the trainer's bitwise path (test_families.py), and the HF
fallback with its cache keyword (test_engine.py). No stub: the same tests, the older library.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

FLOOR = Path(sys.prefix) / "floor"
ROOT = Path(__file__).resolve().parents[2]


def test_the_declared_floor_runs_the_model_code():
    if not (FLOOR / "transformers").is_dir():
        pytest.fail(f"{FLOOR} is missing: run `make setup` (it installs the transformers floor there)")
    env = {**os.environ, "PYTHONPATH": str(FLOOR)}
    version = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert version == "5.0.0"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_families.py",
                        "tests/unit/test_engine.py::test_generic_hf_path_for_other_architectures"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
