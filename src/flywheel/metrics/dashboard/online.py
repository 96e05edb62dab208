"""What the dashboard shows of an online run: deploys, rollbacks and gate verdicts, live accept rate, traffic.

    log = OnlineLog(EventLogReader("runs/online/online.db"))   # any EventSource (below); commands/dashboard.py
    changed = log.poll()                                        # injects online/events.py's reader
    log.view()                                       # JSON for /api/run/<name>/online (as of the last poll)
    log.problem                                      # why the log could not be read, in words ("" when it could)

Why so. `flywheel serve` keeps its state in an event log (`<run_dir>/online.db`, SQLite in WAL mode, or PostgreSQL
with `online.serve.db_url`) that the server, the learner and `flywheel deploy` write while the dashboard watches.
The dashboard (layer 4) sits below online/ (layer 5, docs/architecture.md) and cannot import it, so it reads
through the `EventSource` protocol defined here; online/events.py's `EventLogReader` is the one implementation
(SQLite read-only, PostgreSQL in read-only transactions) and `flywheel dashboard` hands it in. Each poll is one
snapshot (one read transaction over every table) and asks only for rows past the last `seq` it saw, so a poll
costs what was appended, not the size of the log. Nothing grows with the traffic: feedback is folded into
per-version counters and a window of the newest `window` accept/reject signals, which adds a point to the
accept-rate series every `stride` events; when the series passes MAX_POINTS every other point is dropped and the
stride doubles. Deploy events are few (one per candidate); the newest MAX_HISTORY are kept whole, and the deploy
stack and the counts cover all of them. The deployed version follows the rule of online/deploy.py's
`deploy_stack` (a stack of deploys; a rollback pops), and the test compares the two.

Accept rate: the share of `accept` among `accept` and `reject` feedback (the Tab signals, as `flywheel bench
online` counts it); other signals (thumbs, edits, follow-ups) are counted per kind but not in the rate.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_dashboard_online.py tests/integration/test_dashboard_online_browser.py`.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DB_NAME = "online.db"  # where `flywheel serve` keeps its event log unless online.serve.db_url says otherwise
HISTORY_KINDS = ("deploy", "rollback", "gate_reject", "learner_reset")  # rows of the history table
MAX_POINTS = 2000  # accept-rate points kept; past it every other point is dropped and the stride doubles
MAX_HISTORY = 1000  # newest deploy/rollback/gate-rejection/reset events kept for the table and the chart
BATCH = 5000  # feedback rows read per query (a poll reads them all, in batches)
BUSY_TIMEOUT_S = 2.0  # a writer holding the file this long makes the poll retry next time, not wait


class EventRow(Protocol):
    """One deploy-side event (online/events.py's `Event`)."""

    seq: int
    kind: str
    version: int | None
    reason: str
    data: dict[str, Any]
    created_s: float


class Snapshot(Protocol):
    """The reads of one poll, all from one moment of the log; rows with seq in (after, upto]."""

    def tops(self) -> dict[str, int]:
        """The newest seq of "completions", "feedback" and "events"."""
        ...

    def events_between(self, after: int, upto: int) -> Sequence[EventRow]: ...

    def completions_by_version(self, after: int, upto: int) -> list[tuple[int, int]]:
        """(version, number of completions)."""
        ...

    def feedback_between(self, after: int, upto: int, limit: int) -> list[tuple[int, str, float, int | None]]:
        """(seq, signal, created_s, version of its completion or None), oldest first, at most `limit`."""
        ...


class EventSource(Protocol):
    """An online run's event log as the dashboard reads it: never written. `snapshot()` raises (any exception,
    its message the database's own) when the log cannot be read; `close()` drops connections (the next snapshot
    reconnects). `name` names it in sentences; `path` is its SQLite file, None for a database server."""

    name: str
    path: Path | None

    def snapshot(self) -> AbstractContextManager[Snapshot]: ...

    def close(self) -> None: ...


# Given a run directory and its config.json (a dict), the run's event log, or None when it has none (yet).
EventSourceOpener = Callable[[Path, dict[str, Any]], "EventSource | None"]


@dataclass
class VersionStats:
    """Traffic and feedback of one served version."""

    completions: int = 0
    feedback: int = 0
    accepts: int = 0
    rejects: int = 0
    signals: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        judged = self.accepts + self.rejects
        return {"completions": self.completions, "feedback": self.feedback, "accepts": self.accepts,
                "rejects": self.rejects, "accept_rate": self.accepts / judged if judged else None,
                "signals": dict(self.signals)}


def follow_deploys(stack: list[int], kind: str, version: int | None) -> None:
    """Versions deployed and not rolled back, oldest first (the top serves), after one more event: the rule of
    online/deploy.py's `deploy_stack`, applied event by event."""
    if kind == "deploy" and version is not None:
        stack.append(int(version))
    elif kind == "rollback" and len(stack) > 1:
        stack.pop()


def _json_dict(text: Any) -> dict[str, Any]:
    try:
        data = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _gate(figures: dict[str, Any]) -> dict[str, Any]:
    """The gate's headline figures (the full ones hold per-version score dicts)."""
    keys = ("num_prompts", "wins", "losses", "p_worse", "mean_delta", "serving_version")
    out = {k: figures[k] for k in keys if k in figures}
    ref = figures.get("reference")
    if isinstance(ref, dict) and "version" in ref:
        out["reference_version"] = ref["version"]
    return out


class OnlineLog:
    """One online run's event log, read incrementally through `source`; `view()` is what the page draws."""

    def __init__(self, source: EventSource, window: int = 32):
        if window < 1:
            raise ValueError(f"the accept-rate window must be at least 1 feedback event (got {window})")
        self.source = source
        self.path = source.path
        self.window = window
        self.problem = ""
        self.generation = 0  # counts polls that found something new
        self._inode: int | None = None
        self._view: dict[str, Any] = {}
        self.reset()
        self.poll()

    def reset(self) -> None:
        """Forget what was read (the file was replaced, or its tables went back)."""
        self.seq = {"events": 0, "feedback": 0, "completions": 0}
        self.history: deque[dict[str, Any]] = deque(maxlen=MAX_HISTORY)  # the newest HISTORY_KINDS events
        self.stack: list[int] = []  # deployed versions not rolled back; the top serves
        self.gate_passes: dict[int, dict[str, Any]] = {}  # version -> the gate figures that let it ship
        self.kinds: Counter = Counter()  # events read, by kind
        self.versions: dict[int, VersionStats] = {}
        self.recent: deque[bool] = deque(maxlen=self.window)  # newest accept (True) / reject (False) signals
        self.num_judged = 0  # accept + reject events read
        self.stride = max(1, self.window // 4)
        self.points: list[tuple[float, float, int]] = []  # (time s, accept rate over the window, events so far)
        self.last_s: float | None = None  # time of the newest feedback read
        self.newest_s: float | None = None  # time of the newest feedback or event read: is the run still active?

    # ---- reading ------------------------------------------------------------------------------------

    def close(self) -> None:
        self.source.close()

    def poll(self) -> int:
        """Read the rows added since the last poll; returns how many. Problems become `self.problem`.

        The view is rebuilt here, in the poller's thread, so a request never reads counters mid-update."""
        n = self._poll()
        self._view = self._build_view()
        return n

    def _file_changed(self) -> str:
        """For an SQLite log: "" when the file is there (a new file also resets what was read), else why not."""
        assert self.path is not None
        if not self.path.exists():
            self.close()
            return f"{self.path.name} is gone (the online run's event log)" if self._inode else \
                f"no {self.path.name} yet"
        inode = self.path.stat().st_ino
        if inode != self._inode:  # a new file: its connections are to the old one; read the new one from its start
            self.close()
            if self._inode is not None:
                self.reset()
            self._inode = inode
        return ""

    def _poll(self) -> int:
        if self.path is not None and (missing := self._file_changed()):
            self.problem = missing
            return 0
        try:
            with self.source.snapshot() as snap:  # one snapshot for every table read below
                n = self._read(snap)
        except Exception as err:  # noqa: BLE001 - whatever the database says becomes a sentence; polls go on
            self.close()
            self.problem = self._explain(err)
            return 0
        self.problem = ""
        if n:
            self.generation += 1
        return n

    def _explain(self, err: Exception) -> str:
        msg = str(err)
        name = self.source.name
        if "locked" in msg or "busy" in msg:
            return f"{name} is busy (a writer held it past {BUSY_TIMEOUT_S:g} s); read again next poll"
        if "no such table" in msg or "no such column" in msg or "does not exist" in msg:
            return (f"{name} does not hold flywheel's online event log ({msg}): point the dashboard at "
                    "the run directory `flywheel serve` writes (<run_dir>/online.db, or --online-db for "
                    "online.serve.db_url)")
        where = "is it an SQLite file?" if self.path is not None else "is the database server up and reachable?"
        return f"{name} cannot be read ({msg}); {where}"

    def _read(self, snap: Snapshot) -> int:
        tops = snap.tops()
        if any(tops[t] < self.seq[t] for t in self.seq):  # rows vanished: the log was recreated in place
            self.reset()
        return self._read_events(snap, tops["events"]) + self._read_completions(snap, tops["completions"]) + \
            self._read_feedback(snap, tops["feedback"])

    def _read_events(self, snap: Snapshot, top: int) -> int:
        rows = snap.events_between(self.seq["events"], top)
        for ev in rows:
            seq, kind, version, reason, created_s = ev.seq, ev.kind, ev.version, ev.reason, ev.created_s
            self.newest_s = max(self.newest_s or 0.0, float(created_s))
            d = _json_dict(ev.data)
            self.kinds[kind] += 1
            follow_deploys(self.stack, kind, version)
            if kind == "gate_pass" and version is not None:
                self.gate_passes[int(version)] = _gate(d)
            elif kind in HISTORY_KINDS:
                row = {"seq": seq, "kind": kind, "version": version, "reason": reason, "time_s": created_s,
                       "from_version": d.get("from_version"), "source": d.get("source")}
                if kind == "gate_reject":
                    row["gate"] = _gate(d)
                elif kind == "deploy" and version is not None and int(version) in self.gate_passes:
                    row["gate"] = self.gate_passes.pop(int(version))  # a deploy follows its gate pass
                self.history.append(row)
        self.seq["events"] = top
        return len(rows)

    def _read_completions(self, snap: Snapshot, top: int) -> int:
        for version, count in snap.completions_by_version(self.seq["completions"], top):
            self.versions.setdefault(int(version), VersionStats()).completions += int(count)
        n = top - self.seq["completions"]
        self.seq["completions"] = top
        return n

    def _read_feedback(self, snap: Snapshot, top: int) -> int:
        total = 0
        while self.seq["feedback"] < top:
            rows = snap.feedback_between(self.seq["feedback"], top, BATCH)
            if not rows:
                break
            for _seq, signal, created_s, version in rows:
                self._fold(str(signal), float(created_s), None if version is None else int(version))
            self.seq["feedback"] = int(rows[-1][0])
            total += len(rows)
        self.seq["feedback"] = top
        return total

    def _fold(self, signal: str, t: float, version: int | None) -> None:
        """One feedback event into the counters and the accept-rate series."""
        self.last_s = t
        self.newest_s = max(self.newest_s or 0.0, t)
        if version is not None:
            vs = self.versions.setdefault(version, VersionStats())
            vs.feedback += 1
            vs.signals[signal] += 1
            vs.accepts += signal == "accept"
            vs.rejects += signal == "reject"
        if signal not in ("accept", "reject"):
            return
        self.recent.append(signal == "accept")
        self.num_judged += 1
        if self.num_judged % self.stride == 0 or self.num_judged == 1:
            self.points.append((t, sum(self.recent) / len(self.recent), self.num_judged))
            if len(self.points) > MAX_POINTS:
                self.points = self.points[::2]
                self.stride *= 2

    # ---- what the page gets -------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """What the last poll found (a snapshot: later polls build a new one)."""
        return self._view

    def _build_view(self) -> dict[str, Any]:
        judged = sum(v.accepts + v.rejects for v in self.versions.values())
        accepts = sum(v.accepts for v in self.versions.values())
        series = list(self.points)
        if self.recent and (not series or series[-1][2] != self.num_judged):  # the newest value, always shown
            series.append((self.last_s or 0.0, sum(self.recent) / len(self.recent), self.num_judged))
        return {
            "db": str(self.path) if self.path is not None else self.source.name, "problem": self.problem, "window": self.window,
            "deployed_version": self.stack[-1] if self.stack else None,
            "live_accept_rate": sum(self.recent) / len(self.recent) if self.recent else None,
            "accept_rate_all": accepts / judged if judged else None,
            "num_completions": self.seq["completions"], "num_feedback": self.seq["feedback"],
            "num_candidates": self.kinds["candidate"], "num_deploys": self.kinds["deploy"],
            "num_rollbacks": self.kinds["rollback"], "num_gate_rejects": self.kinds["gate_reject"],
            "history": list(self.history),
            "accept_series": {"time_s": [p[0] for p in series], "rate": [p[1] for p in series],
                              "events": [p[2] for p in series]},
            "versions": {str(v): s.to_dict() for v, s in sorted(self.versions.items())},
        }
