import subprocess
import sys
import time


def test_help_is_fast_and_imports_no_torch():
    code = "import sys; from flywheel.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "flywheel.cli", "--help"], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0 and "bench" in res.stdout
    assert elapsed < 3.0  # one second on an idle machine; the bound leaves room for a loaded CI box

