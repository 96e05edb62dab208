"""modeling/quant.py against torchao's own reference implementations (tests/unit/torchao_cases.py), in a child
pytest with .venv/torchao on its path.

    make setup      # installs torchao (Makefile, TORCHAO) into .venv/torchao, without dependencies

Why a child: installed in the venv, torchao is imported by transformers at every model load (seconds, and
warnings on stderr that break the one-line errors the CLI promises), so it stays out of every other process.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCHAO = Path(sys.prefix) / "torchao"
ROOT = Path(__file__).resolve().parents[2]


def test_the_formats_equal_torchao_value_for_value():
    if not (TORCHAO / "torchao").is_dir():
        pytest.fail(f"{TORCHAO} is missing: run `make setup` (it installs torchao there)")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/torchao_cases.py"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(TORCHAO)}, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout and "skipped" not in r.stdout
