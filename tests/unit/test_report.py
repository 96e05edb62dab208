import json

from flywheel.metrics.log import MetricsLog, read_metrics
from flywheel.metrics.report import PANELS, write_report


def test_report_draws_the_panels_whose_metrics_exist(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.write({"step": step, "reward/mean": 0.1 * step, "rollout/pass_rate": 0.1 * step, "loss": 1.0 / step,
                   "weights/bytes_mb": 0.5, "mismatch/k3": float("nan")})
    log.close()
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 4, "reward/me')  # a torn line from a killed writer
    (tmp_path / "summary.json").write_text(json.dumps({"pass1_before": 0.09, "pass1_after": 0.18}))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    html = write_report(tmp_path).read_text()
    assert html.count("data:image/png;base64,") == 3  # reward, loss, weight bytes; k3 was all NaN
    assert "pass1_after" in html and "0.18" in html
    assert all(isinstance(title, str) and keys for title, keys, _ in PANELS)
