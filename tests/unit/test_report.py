import json

from flywheel.metrics.log import MetricsLog, read_metrics
from flywheel.metrics.report import PANELS, summary_html, write_report


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
    assert "Held-out pass@1 went from <b>0.09</b> before RL to <b>0.18</b> after" in html
    assert "This run recorded no trajectories" in html
    assert all(isinstance(title, str) and keys for title, keys, _ in PANELS)


def test_the_summary_reads_as_sentences_and_tables():
    html = summary_html({"pass1_before": 0.1, "pass1_after": 0.25, "pass1_gain": 0.15, "pass1_gain_se": 0.05,
                         "rl": {"steps": 40, "wall_s": 300.0, "trainer_busy": 0.5, "rollouts": 640,
                                "groups_received": 80, "staleness_hist": {"0": 20, "1": 12}, "interrupted": False,
                                "engine/busy": 0.9},
                         "timings_s": {"midtrain": 500.0}, "copy_probe_base": {"exact": 0.5, "n": 30}})
    assert "a gain of 0.15 ± 0.05" in html and "RL ran 40 trainer steps in 300 s" in html
    assert "busy 50 % of that time" in html and "20 at 0, 12 at 1" in html and "midtrain 500 s" in html
    assert "<th>engine/busy</th><td>0.9</td>" in html and "<th>exact</th><td>0.5</td>" in html
    assert "{" not in html  # no raw JSON


def test_progress_in_a_log_prints_an_eta(capsys, monkeypatch):
    from flywheel.pipeline import job

    now = [0.0]
    monkeypatch.setattr(job.time, "monotonic", lambda: now[0])
    p = job.Progress()
    for done in (1, 2, 3):
        now[0] = 100.0 + 10 * done  # 10 s per step
        p.update("RL", done, 10, "reward 0.1")
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["RL: 1/10 reward 0.1", "RL: 2/10 reward 0.1 eta 80 s", "RL: 3/10 reward 0.1 eta 70 s"]
