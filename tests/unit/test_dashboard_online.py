"""The dashboard's view of an online run, read from an event log written by the real EventLog (online/events.py).

    .venv/bin/python -m pytest -q tests/unit/test_dashboard_online.py

Each test writes the log the way `flywheel serve` does (completions, feedback, deploy/gate/rollback events through
EventLog and `deploy.rollback`) and checks the figures the dashboard derives against counts made here by hand.
The dashboard reads it as `flywheel dashboard` does: through online/events.py's EventLogReader, found by
commands/dashboard.py's opener and handed in (metrics/ cannot import online/).
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from aiohttp.test_utils import TestClient, TestServer

import flywheel.metrics.dashboard.online as online_mod
from flywheel.commands.dashboard import event_log_opener, parse_online_dbs
from flywheel.metrics.dashboard.online import OnlineLog
from flywheel.metrics.dashboard.runindex import RunIndex, discover_runs
from flywheel.metrics.dashboard.server import Dashboard, build_app
from flywheel.online.deploy import deployed_version, rollback
from flywheel.online.events import CompletionRecord, EventLog, EventLogReader, EventLogUnreadable, FeedbackRecord

OPENER = event_log_opener({})


def reader_log(path, window: int) -> OnlineLog:
    return OnlineLog(EventLogReader(path), window=window)

GATE = {"num_prompts": 64, "wins": 11, "losses": 3, "p_worse": 0.97, "mean_delta": 0.06,
        "serving": {"score": 0.4}, "candidate": {"score": 0.46}, "serving_version": 0, "candidate_version": 1}


class Writer:
    """Completions and feedback as the server records them; ids are numbered."""

    def __init__(self, elog: EventLog):
        self.elog, self.n = elog, 0

    def serve(self, version: int, signals: list[str]) -> None:
        for s in signals:
            self.n += 1
            self.elog.record_completion(CompletionRecord(f"c{self.n}", "k", "flywheel", version, [1, 2], [3, 4],
                                                         [-0.5, -0.5], [version, version], "stop", "ab"))
            if s:
                self.elog.record_feedback(FeedbackRecord(f"f{self.n}", f"c{self.n}", "k", s))


def history(tmp_path):
    """v0 deployed; v1 ships past the gate; v2 is rejected; v1 is rolled back; 3 completions without feedback."""
    elog = EventLog(tmp_path / "online.db")
    w = Writer(elog)
    elog.append_event("deploy", 0, "initial version")
    w.serve(0, ["accept", "reject", "reject", "reject", "thumbs_up", ""])
    elog.append_event("candidate", 1, "6 feedback events since version 0")
    elog.append_event("gate_pass", 1, "no significant regression", GATE)
    elog.append_event("deploy", 1, "gate passed: no significant regression", {"from_version": 0})
    w.serve(1, ["accept", "accept", "reject", "accept", "", ""])
    elog.append_event("candidate", 2, "4 feedback events since version 1")
    elog.append_event("gate_reject", 2, "lost 20 of 24", {**GATE, "wins": 4, "losses": 20, "p_worse": 0.001})
    rollback(elog, "automatic: live reward of version 1 fell", {"source": "live_monitor"})
    return elog, w


def test_history_gate_figures_and_per_version_counts(tmp_path):
    elog, _ = history(tmp_path)
    log = reader_log(tmp_path / "online.db", window=4)
    v = log.view()
    assert v["problem"] == ""
    assert [(h["kind"], h["version"]) for h in v["history"]] == \
        [("deploy", 0), ("deploy", 1), ("gate_reject", 2), ("rollback", 0)]
    assert v["history"][1]["gate"] == {"num_prompts": 64, "wins": 11, "losses": 3, "p_worse": 0.97,
                                       "mean_delta": 0.06, "serving_version": 0}
    assert v["history"][2]["gate"]["losses"] == 20 and "lost 20 of 24" in v["history"][2]["reason"]
    rb = v["history"][3]
    assert rb["from_version"] == 1 and rb["source"] == "live_monitor" and rb["reason"].startswith("automatic:")
    assert v["deployed_version"] == deployed_version(elog.events(("deploy", "rollback"))) == 0
    assert (v["num_deploys"], v["num_rollbacks"], v["num_gate_rejects"], v["num_candidates"]) == (2, 1, 1, 2)
    assert v["num_completions"] == 12 and v["num_feedback"] == 9
    v0, v1 = v["versions"]["0"], v["versions"]["1"]
    assert (v0["completions"], v0["feedback"], v0["accepts"], v0["rejects"]) == (6, 5, 1, 3)
    assert v0["accept_rate"] == 1 / 4 and v0["signals"]["thumbs_up"] == 1  # thumbs count, but not in the rate
    assert (v1["completions"], v1["feedback"], v1["accept_rate"]) == (6, 4, 3 / 4)
    # 8 accept/reject signals in order: A R R R | A A R A; the window holds the newest 4
    assert v["live_accept_rate"] == 3 / 4 and v["accept_rate_all"] == 4 / 8
    s = v["accept_series"]
    assert s["events"] == [1, 2, 3, 4, 5, 6, 7, 8]  # stride = window // 4 = 1
    assert s["rate"] == [1, 1 / 2, 1 / 3, 1 / 4, 1 / 4, 2 / 4, 2 / 4, 3 / 4]
    assert s["time_s"] == sorted(s["time_s"])
    log.close()
    elog.close()


def test_polls_read_only_what_was_added_while_the_server_writes(tmp_path):
    elog, w = history(tmp_path)
    log = reader_log(tmp_path / "online.db", window=4)
    gen = log.generation
    assert log.poll() == 0 and log.generation == gen
    w.serve(0, ["accept", "accept"])
    elog.append_event("deploy", 3, "gate passed: …", {"from_version": 0})
    assert log.poll() == 2 + 2 + 1  # completions, feedback, one event
    v = log.view()
    assert v["deployed_version"] == 3 and v["versions"]["0"]["accepts"] == 3 and v["live_accept_rate"] == 3 / 4
    # a writer in the middle of a transaction neither blocks the poll nor shows it half-done (WAL snapshot)
    other = sqlite3.connect(tmp_path / "online.db")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO events (kind, version, reason, data, created_s) VALUES ('deploy', 4, 'x', '{}', 1)")
    assert log.poll() == 0 and log.view()["deployed_version"] == 3
    other.commit()
    assert log.poll() == 1 and log.view()["deployed_version"] == 4
    other.close()
    # the dashboard's connection cannot write, whatever asks it to
    with pytest.raises(EventLogUnreadable, match="readonly"), EventLogReader(tmp_path / "online.db").snapshot() as snap:
        snap.conn.exec_driver_sql("DELETE FROM events")
    log.close()
    elog.close()


def test_what_is_kept_stays_bounded_however_long_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(online_mod, "MAX_POINTS", 10)
    monkeypatch.setattr(online_mod, "MAX_HISTORY", 3)
    elog = EventLog(tmp_path / "online.db")
    w = Writer(elog)
    signals = ["accept" if i % 3 else "reject" for i in range(200)]
    w.serve(0, signals)
    for version in range(6):
        elog.append_event("deploy", version, f"deploy {version}")
    rollback(elog, "manual")
    log = reader_log(tmp_path / "online.db", window=8)
    v = log.view()
    assert [(h["kind"], h["version"]) for h in v["history"]] == [("deploy", 4), ("deploy", 5), ("rollback", 4)]
    assert v["num_deploys"] == 6 and v["num_rollbacks"] == 1  # counted over every event, kept or not
    assert v["deployed_version"] == deployed_version(elog.events(("deploy", "rollback"))) == 4
    assert len(log.points) <= 10 and log.stride > 2  # every other point dropped, the stride doubled
    assert v["accept_series"]["events"][-1] == 200
    assert v["live_accept_rate"] == pytest.approx(sum(s == "accept" for s in signals[-8:]) / 8)
    assert v["accept_series"]["rate"][-1] == v["live_accept_rate"]
    assert v["versions"]["0"]["accepts"] == sum(s == "accept" for s in signals)
    log.close()
    elog.close()


def test_a_corrupt_foreign_or_vanished_log_is_a_sentence_not_a_crash(tmp_path):
    run = tmp_path / "online"
    run.mkdir()
    (run / "online.db").write_bytes(b"this is not a database\n" * 100)
    index = RunIndex(run, open_event_log=OPENER)
    assert discover_runs(tmp_path) == [run] and index.online is not None
    assert any("online.db cannot be read" in n and "SQLite" in n for n in index.status())
    (run / "online.db").unlink()
    con = sqlite3.connect(run / "online.db")
    con.execute("CREATE TABLE other (x)")
    con.commit()
    con.close()
    assert index.poll()["online"] == 1  # a new problem is a change: the open pages' banners get it
    assert any("does not hold flywheel's online event log" in n for n in index.status())
    assert index.poll()["online"] == 0
    (run / "online.db").unlink()
    index.poll()
    assert any("online.db is gone" in n for n in index.status())
    elog, _ = history(run)  # a new log in its place is read from the start
    index.poll()
    assert index.status() == [] and index.online.view()["num_deploys"] == 2
    elog.close()


def test_the_server_lists_the_online_run_and_serves_its_view(tmp_path):
    elog, _ = history(tmp_path / "online")

    async def go():
        client = TestClient(TestServer(build_app(Dashboard(tmp_path, poll_s=0.05, open_event_log=OPENER))))
        await client.start_server()
        try:
            runs = await (await client.get("/api/runs")).json()
            view = await (await client.get("/api/run/online/online")).json()
            detail = await (await client.get("/api/run/online")).json()
            return runs, view, detail
        finally:
            await client.close()

    runs, view, detail = asyncio.run(go())
    assert [(r["name"], r["online"], r["notes"]) for r in runs["runs"]] == [("online", True, [])]
    assert view["num_rollbacks"] == 1 and view["history"][-1]["kind"] == "rollback"
    assert detail["online"] is True
    elog.close()


def test_a_log_replaced_by_another_is_read_from_its_start(tmp_path):
    elog, _ = history(tmp_path)
    log = reader_log(tmp_path / "online.db", window=4)
    assert log.view()["num_deploys"] == 2
    elog.close()
    other = EventLog(tmp_path / "b" / "online.db")  # more rows of each kind than the first: seq alone cannot tell
    other.append_event("deploy", 7, "initial")
    Writer(other).serve(7, ["accept"] * 20)
    for i in range(10):
        other.append_event("learner_reset", 7, f"reset {i}")
    other.close()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"online.db{suffix}").unlink(missing_ok=True)
    (tmp_path / "b" / "online.db").replace(tmp_path / "online.db")
    log.poll()
    v = log.view()
    assert (v["num_deploys"], v["deployed_version"], v["num_completions"], list(v["versions"])) == (1, 7, 20, ["7"])
    log.close()


def test_without_an_opener_there_is_no_online_view_and_a_named_run_is_listed(tmp_path):
    """The dashboard reads an event log only through what it is handed; `--online-db RUN=URL` lists RUN even when
    its directory holds nothing else (a log on a database server leaves no file behind)."""
    elog, _ = history(tmp_path / "online")
    assert RunIndex(tmp_path / "online").online is None
    (tmp_path / "served").mkdir()
    assert discover_runs(tmp_path) == [tmp_path / "online"]
    assert discover_runs(tmp_path, frozenset({"served"})) == [tmp_path / "online", tmp_path / "served"]
    urls = parse_online_dbs([f"served=sqlite:///{tmp_path / 'online' / 'online.db'}"], tmp_path)
    index = RunIndex(tmp_path / "served", open_event_log=event_log_opener(urls))
    assert index.online is not None and index.online.view()["num_deploys"] == 2 and index.status() == []
    assert parse_online_dbs(["postgresql+psycopg://u@h/db?sslmode=require"], tmp_path / "served") == \
        {"served": "postgresql+psycopg://u@h/db?sslmode=require"}
    broken = RunIndex(tmp_path / "served", open_event_log=event_log_opener({"served": "nosuchdriver://x"}))
    assert broken.online is None and any("cannot open the event log" in n for n in broken.status())
    elog.close()
