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
    assert "<th>engine busy</th><td>90.0 %</td>" in html
    assert "<th>copy probe of the base › held-out edits copied exactly</th><td>0.5</td>" in html
    assert "{" not in html  # no raw JSON


def test_the_summary_table_has_labels_in_words_and_formatted_values():
    """The review found `halted None` and `buffer/dropped_uniform` in the report: raw keys and Python values."""
    html = summary_html({"rl": {"steps": 3, "wall_s": 10.7, "halted": None, "groups_granted": None,
                                "buffer/dropped_uniform": 4, "buffer/some_new_count": 1200, "weights/apply_ms": 52.07,
                                "interrupted": False}, "wall_s": 3723.5})
    assert "None" not in html and "buffer/" not in html and "_" not in html.replace("&#x27;", "")
    assert "<th>halted by the anti-cheat monitor</th><td>no</td>" in html
    assert "<th>groups dropped: every reward equal (no signal)</th><td>4</td>" in html
    assert "<th>buffer: some new count</th><td>1,200</td>" in html  # a key without a label is spelled out
    assert "<th>weight fetch + apply</th><td>52.07 ms</td>" in html and "<td>3724 s</td>" in html
    assert "<th>group starts granted (paced async)</th><td>–</td>" in html
    halted = summary_html({"rl": {"steps": 2, "halted": {"flag": "tests_edited", "rate": 0.25, "window": 40}}})
    assert "yes: flag tests_edited in 25.0 % of the last 40 sessions" in halted


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
