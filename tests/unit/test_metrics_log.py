"""MetricsLog: JSONL always; TensorBoard only when asked, and a clear error when its package is missing
(the demo installs only the runtime dependencies, which leave TensorBoard out)."""

import sys

import pytest

from flywheel.metrics.log import MetricsLog, read_metrics


def test_writes_jsonl_records_with_a_time(tmp_path):
    log = MetricsLog(tmp_path)
    log.write({"step": 1, "loss": 0.5, "bad": float("nan")})
    log.close()
    (rec,) = read_metrics(log.path)
    assert rec["step"] == 1 and rec["loss"] == 0.5 and rec["bad"] is None and "time" in rec


def test_tensorboard_without_its_package_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ValueError, match=r"flywheel\[tensorboard\].*metrics.tensorboard = false"):
        MetricsLog(tmp_path, tensorboard=True)
