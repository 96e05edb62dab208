"""The dashboard's Online view in a real headless Chromium, on an event log written by the real EventLog.

    .venv/bin/python -m pytest -q tests/integration/test_dashboard_online_browser.py
    FLYWHEEL_SCREENSHOTS=docs/observability .venv/bin/python -m pytest -q tests/integration/test_dashboard_online_browser.py

The log holds what `flywheel serve` writes: completions with users' accept/reject feedback, candidates with gate
verdicts, deploys, a gate rejection and a rollback (OnlineRun below). The server is `flywheel
dashboard` in a child process; the page is driven by Playwright. While the page is open, more feedback and a
deploy are written: they appear without a reload. The same view of a log on a real PostgreSQL server (the cluster
of test_online_postgres.py; skipped where PostgreSQL is not installed), read through `--online-db RUN=URL`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from test_online_postgres import postgres_url  # noqa: F401 - the fixture: a PostgreSQL cluster for this module

from flywheel.metrics.dashboard.browser import DashboardProcess, launch_chromium
from flywheel.online.deploy import rollback
from flywheel.online.events import CompletionRecord, EventLog, EventLogReader, EventLogUnreadable, FeedbackRecord

pytestmark = [pytest.mark.browser]
SHOTS = os.environ.get("FLYWHEEL_SCREENSHOTS")


class OnlineRun:
    """An online run's event log (`<run_dir>/online.db`) written with the real EventLog, as `flywheel serve` and its
    learner write it: completions, users' feedback, candidates, gate verdicts, deploys and rollbacks."""

    GATE = {"num_prompts": 256, "wins": 31, "losses": 9, "p_worse": 0.9999, "mean_delta": 0.041,
            "serving": {"score": 0.41}, "candidate": {"score": 0.45}}

    def __init__(self, run_dir: Path, url: str = ""):
        self.elog = EventLog(url or run_dir / "online.db")
        self.n = 0
        self.signals: list[str] = []

    def serve(self, version: int, accept_every: int, count: int) -> None:
        """`count` completions of `version`, each with feedback: every `accept_every`-th one rejected."""
        for i in range(count):
            self.n += 1
            self.elog.record_completion(CompletionRecord(f"c{self.n}", "k", "flywheel", version, [1, 2], [3],
                                                         [-0.5], [version], "stop", "a"))
            signal = "reject" if i % accept_every == 0 else "accept"
            self.elog.record_feedback(FeedbackRecord(f"f{self.n}", f"c{self.n}", "k", signal))
            self.signals.append(signal)

    def ship(self, version: int, serving: int) -> None:
        self.elog.append_event("candidate", version, f"48 feedback events since version {serving}")
        self.elog.append_event("gate_pass", version, "no significant regression",
                               {**self.GATE, "serving_version": serving, "candidate_version": version})
        self.elog.append_event("deploy", version, "gate passed: no significant regression: won 31, lost 9",
                               {"from_version": serving})

    def reject(self, version: int, serving: int) -> None:
        self.elog.append_event("candidate", version, f"48 feedback events since version {serving}")
        self.elog.append_event("gate_reject", version, "lost 23 and won 6 of the held-out prompts (p_worse = 0.0012)",
                               {**self.GATE, "wins": 6, "losses": 23, "p_worse": 0.0012, "serving_version": serving})


def pixels(page, selector: str, rgb: tuple[int, int, int]) -> int:
    """Pixels of colour `rgb` on the canvas under `selector`."""
    return page.evaluate("""([sel, rgb]) => {
        const c = document.querySelector(`${sel} canvas`);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] === rgb[0] && d[i + 1] === rgb[1] && d[i + 2] === rgb[2]) n++;
        return n; }""", [selector, list(rgb)])


def test_online_view_shows_deploys_rollbacks_and_live_accept_rate(tmp_path):
    runs = tmp_path / "runs"
    run = runs / "online"
    run.mkdir(parents=True)
    log = OnlineRun(run)
    log.elog.append_event("deploy", 0, "initial version (the policy `flywheel serve` started with)")
    log.serve(0, accept_every=2, count=40)  # half accepted
    log.ship(1, serving=0)
    log.serve(1, accept_every=4, count=40)  # three in four
    log.reject(2, serving=1)
    log.serve(1, accept_every=3, count=20)
    log.ship(3, serving=1)
    log.serve(3, accept_every=1, count=16)  # every one rejected: the live monitor rolls it back
    rollback(log.elog, "automatic: live reward of version 3 fell to -0.250 over 16 feedback events",
             {"source": "live_monitor"})
    log.serve(1, accept_every=4, count=12)
    window = 16  # `--online-window`: the live accept rate is over the newest 16 accept/reject events
    server = DashboardProcess(runs, "--online-window", str(window))
    with sync_playwright() as pw:
        context, profile = launch_chromium(pw)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(server.url)  # a serving run has no trainer metrics: the page opens on its Online view
            page.wait_for_selector("body[data-ready='1']", timeout=20_000)
            page.wait_for_selector("#view-online:not([hidden]) tr.online-event", timeout=10_000)
            assert page.is_visible("#nav-online") and not page.is_visible("#banner")
            kinds = page.locator("tr.online-event").evaluate_all("els => els.map(e => e.dataset.kind + e.dataset.version)")
            assert kinds == ["rollback1", "deploy3", "gate_reject2", "deploy1", "deploy0"]  # newest first
            rb = page.locator("tr.online-event.rollback").text_content()
            assert "automatic: live reward of version 3 fell" in rb and "v3" in rb
            assert "won 31, lost 9" in page.locator("tr.online-event.deploy[data-version='1']").text_content()
            assert "lost 23 and won 6" in page.locator("tr.online-event.gate_reject").text_content()
            assert page.text_content('.tile[data-key="deployed_version"] .value') == "v1"
            newest = log.signals[-window:]
            live = sum(s == "accept" for s in newest) / len(newest)
            shown = page.text_content('.tile[data-key="live_accept_rate"] .value')
            assert shown.endswith(" %") and float(shown[:-2]) == pytest.approx(100 * live, abs=0.05)  # 1 decimal
            served = {"0": 40, "1": 72, "3": 16}
            for ver, n in served.items():
                cells = page.locator(f"table.online-versions tr[data-version='{ver}'] td").all_text_contents()
                assert cells[1] == str(n), (ver, cells)
            xs, ys = page.evaluate("FlywheelOnline.state.chart.data")
            api = server.get("api/run/online/online")["accept_series"]
            assert xs == pytest.approx(api["time_s"]) and ys == pytest.approx(api["rate"])
            assert len(ys) >= len(log.signals) // (window // 4) and ys[-1] == pytest.approx(live)
            assert pixels(page, "#online-chart", (31, 119, 180)) > 50  # the accept-rate line (#1f77b4)
            assert pixels(page, "#online-chart", (44, 160, 44)) > 50  # deploy markers (#2ca02c)
            assert pixels(page, "#online-chart", (214, 39, 40)) > 20  # the rollback marker (#d62728)
            if SHOTS:
                Path(SHOTS).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(SHOTS) / "online.png"), full_page=True)
            # live: more feedback and a new deploy arrive while the page is open
            before = len(ys)
            log.serve(1, accept_every=5, count=12)
            log.ship(4, serving=1)
            page.wait_for_selector("tr.online-event[data-kind='deploy'][data-version='4']", timeout=10_000)
            page.wait_for_function(f"FlywheelOnline.state.chart.data[0].length > {before}", timeout=10_000)
            assert page.text_content('.tile[data-key="deployed_version"] .value') == "v4"
            assert page.text_content('.tile[data-key="num_feedback"] .value') == str(len(log.signals))
            assert server.proc.poll() is None
        finally:
            page.close()
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
            server.stop()
            log.elog.close()
    assert not errors, f"the page raised: {errors}"


def test_the_online_view_reads_a_log_on_postgres(tmp_path, postgres_url):  # noqa: F811 - the fixture above
    """`flywheel serve` with online.serve.db_url on PostgreSQL leaves no online.db: `--online-db RUN=URL` names the
    log, the run is listed though its directory is empty, and the figures are those of the SQLite path."""
    run = tmp_path / "runs" / "served"
    run.mkdir(parents=True)
    log = OnlineRun(run, postgres_url)
    log.elog.append_event("deploy", 0, "initial version")
    log.serve(0, accept_every=2, count=10)
    log.ship(1, serving=0)
    log.serve(1, accept_every=5, count=10)
    rollback(log.elog, "manual: v1 answers worse", {"source": "flywheel deploy rollback"})
    server = DashboardProcess(tmp_path / "runs", "--online-window", "8", "--online-db", f"served={postgres_url}")
    try:
        runs = server.get("api/runs")["runs"]
        assert [(r["name"], r["online"], r["notes"]) for r in runs] == [("served", True, [])]
        view = server.get("api/run/served/online")
        assert view["problem"] == "" and view["db"].startswith("postgresql+psycopg://")
        assert (view["num_completions"], view["num_feedback"], view["num_deploys"], view["num_rollbacks"]) == \
            (20, 20, 2, 1)
        assert view["deployed_version"] == 0 and [h["kind"] for h in view["history"]] == ["deploy", "deploy", "rollback"]
        assert view["history"][1]["gate"]["wins"] == 31  # the gate's figures reach the deploy row
        newest = log.signals[-8:]
        assert view["live_accept_rate"] == pytest.approx(sum(s == "accept" for s in newest) / 8)
        assert view["versions"]["1"]["accepts"] == 8 and view["versions"]["0"]["rejects"] == 5
        log.serve(1, accept_every=1, count=3)  # rows written while the dashboard runs arrive with the next poll
        deadline = time.monotonic() + 10
        while server.get("api/run/served/online")["num_feedback"] != 23 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.get("api/run/served/online")["num_feedback"] == 23
    finally:
        server.stop()
    reader = EventLogReader(postgres_url)  # the dashboard's connection: read-only transactions
    with pytest.raises(EventLogUnreadable, match="read-only"), reader.snapshot() as snap:
        snap.conn.exec_driver_sql("DELETE FROM events")
    reader.close()
    log.elog.close()
