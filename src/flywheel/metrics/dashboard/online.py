"""What the dashboard shows of an online run: deploys, rollbacks and gate verdicts, live accept rate, traffic.

    log = OnlineLog(Path("runs/online/online.db"))   # the event log `flywheel serve` writes (online/events.py)
    changed = log.poll()                             # reads only rows added since the last poll; never raises
    log.view()                                       # JSON for /api/run/<name>/online (as of the last poll)
    log.problem                                      # why the log could not be read, in words ("" when it could)

Why so. `flywheel serve` keeps its state in one SQLite file in WAL mode (`<run_dir>/online.db`) that the server, the
learner and `flywheel deploy` write while the dashboard watches. The file is opened read-only (`mode=ro`): the
dashboard can never write to it, and in WAL mode a reader neither blocks the writers nor sees half a
transaction. Each poll runs in one read transaction (one snapshot of all tables) and asks only for rows past the
last `seq` it saw, so a poll costs what was appended, not the size of the log. Nothing grows with the traffic:
feedback is folded into per-version counters and a window of the newest `window` accept/reject signals, which
adds a point to the accept-rate series every `stride` events; when the series passes MAX_POINTS every other
point is dropped and the stride doubles. Deploy events are few (one per candidate); the newest MAX_HISTORY are
kept whole, and the deploy stack and the counts cover all of them.

The tables and columns are those of online/events.py. The dashboard (layer 4) sits below online/ (layer 5,
docs/architecture.md), so it cannot import that module: it reads the schema by name with sqlite3, and the unit
test writes the log with the real EventLog, so a change of schema fails there. The deployed version follows the
rule of online/deploy.py's `deploy_stack` (a stack of deploys; a rollback pops), and the test compares the two.

Accept rate: the share of `accept` among `accept` and `reject` feedback (the Tab signals, as `flywheel bench
online` counts it); other signals (thumbs, edits, follow-ups) are counted per kind but not in the rate.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_dashboard_online.py tests/integration/test_dashboard_online_browser.py`.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DB_NAME = "online.db"  # where `flywheel serve` keeps its event log unless online.serve.db_url says otherwise
HISTORY_KINDS = ("deploy", "rollback", "gate_reject", "learner_reset")  # rows of the history table
MAX_POINTS = 2000  # accept-rate points kept; past it every other point is dropped and the stride doubles
MAX_HISTORY = 1000  # newest deploy/rollback/gate-rejection/reset events kept for the table and the chart
BATCH = 5000  # feedback rows read per query (a poll reads them all, in batches)
BUSY_TIMEOUT_S = 2.0  # a writer holding the file this long makes the poll retry next time, not wait


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
    """One online run's event log, read incrementally and read-only; `view()` is what the page draws."""

    def __init__(self, path: Path, window: int = 32):
        if window < 1:
            raise ValueError(f"the accept-rate window must be at least 1 feedback event (got {window})")
        self.path = Path(path)
        self.window = window
        self.problem = ""
        self.generation = 0  # counts polls that found something new
        self._conn: sqlite3.Connection | None = None
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
        self.last_s: float | None = None

    # ---- reading ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self) -> sqlite3.Connection:
        inode = self.path.stat().st_ino
        if inode != self._inode:  # a new file (also after an error closed the last connection): start again
            self.close()
            if self._inode is not None:
                self.reset()
            self._inode = inode
        if self._conn is None:
            # mode=ro: this process cannot write, whatever a bug asks; isolation_level None: transactions are ours;
            # check_same_thread off: the dashboard polls from a worker thread, one poll at a time (its lock)
            self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                         timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        return self._conn

    def poll(self) -> int:
        """Read the rows added since the last poll; returns how many. Problems become `self.problem`.

        The view is rebuilt here, in the poller's thread, so a request never reads counters mid-update."""
        n = self._poll()
        self._view = self._build_view()
        return n

    def _poll(self) -> int:
        if not self.path.exists():
            self.close()
            self.problem = f"{self.path.name} is gone (the online run's event log)" if self._inode else \
                f"no {self.path.name} yet"
            return 0
        try:
            conn = self._connect()
            conn.execute("BEGIN")  # one snapshot for every table read below
            try:
                n = self._read(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as err:
            self.close()
            self.problem = self._explain(err)
            return 0
        self.problem = ""
        if n:
            self.generation += 1
        return n

    def _explain(self, err: sqlite3.Error) -> str:
        msg = str(err)
        if "locked" in msg or "busy" in msg:
            return f"{self.path.name} is busy (a writer held it past {BUSY_TIMEOUT_S:g} s); read again next poll"
        if "no such table" in msg or "no such column" in msg:
            return (f"{self.path.name} does not hold flywheel's online event log ({msg}): point the dashboard at "
                    "the run directory `flywheel serve` writes (online.serve.db_url or <run_dir>/online.db)")
        return f"{self.path.name} cannot be read ({type(err).__name__}: {msg}); is it an SQLite file?"

    def _read(self, conn: sqlite3.Connection) -> int:
        tops = {t: int(conn.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {t}").fetchone()[0]) for t in self.seq}
        if any(tops[t] < self.seq[t] for t in tops):  # rows vanished: the log was recreated in place
            self.reset()
        return self._read_events(conn, tops["events"]) + self._read_completions(conn, tops["completions"]) + \
            self._read_feedback(conn, tops["feedback"])

    def _read_events(self, conn: sqlite3.Connection, top: int) -> int:
        rows = conn.execute("SELECT seq, kind, version, reason, data, created_s FROM events "
                            "WHERE seq > ? AND seq <= ? ORDER BY seq", (self.seq["events"], top)).fetchall()
        for seq, kind, version, reason, data, created_s in rows:
            d = _json_dict(data)
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

    def _read_completions(self, conn: sqlite3.Connection, top: int) -> int:
        rows = conn.execute("SELECT version, COUNT(*) FROM completions WHERE seq > ? AND seq <= ? GROUP BY version",
                            (self.seq["completions"], top)).fetchall()
        for version, count in rows:
            self.versions.setdefault(int(version), VersionStats()).completions += int(count)
        n = top - self.seq["completions"]
        self.seq["completions"] = top
        return n

    def _read_feedback(self, conn: sqlite3.Connection, top: int) -> int:
        total = 0
        while self.seq["feedback"] < top:
            rows = conn.execute(
                "SELECT f.seq, f.signal, f.created_s, c.version FROM feedback f "
                "LEFT JOIN completions c ON c.id = f.completion_id "
                "WHERE f.seq > ? AND f.seq <= ? ORDER BY f.seq LIMIT ?", (self.seq["feedback"], top, BATCH)).fetchall()
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
            "db": str(self.path), "problem": self.problem, "window": self.window,
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
