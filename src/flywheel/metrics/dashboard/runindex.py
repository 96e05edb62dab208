"""What the dashboard knows about one run directory, kept current by polling and never loaded whole.

    run = RunIndex(Path("runs/demo"), open_event_log=opener)   # opener: an online run's log (online.py)
    changed = run.poll()                     # reads only what was appended since the last poll
    run.metrics.records, run.problems        # every metrics record; what could not be read, in words
    rows = run.trajectories.select(task="t3", min_reward=0.5)
    traj = run.trajectories.load(rows[0]["id"])   # one seek + one line read

Why so: a run writes `metrics.jsonl` and `trajectories/*.jsonl` append-only while the dashboard watches, and a
long run holds tens of thousands of transcripts (token ids, log-probs and versions of every token: tens of KB
each). The index keeps, per trajectory, the byte offset of its line and a small summary; a transcript is read
from disk when it is opened. The summary is taken without parsing the token arrays: `Trajectory.to_dict` puts
the numeric `segments` between the small head (task and group ids) and the small tail (reward, turns, meta),
and a JSON string cannot hold an unescaped quote, so the keys are found by byte search and only the head and
tail are parsed. Any line the fast path does not understand is parsed in full instead.

Bad input never raises: a torn last line (a writer still at work) waits for its newline; a complete line that
is not JSON, a record that is not an object, a missing or unreadable file become `problems`, shown as such.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.metrics.dashboard.online import DB_NAME, EventSourceOpener, OnlineLog
from flywheel.types import Trajectory

_SEGMENTS = b'"segments": ['
_REWARD = b'"reward": '
_NEXT_TRAJ = b'}, {"task_id": '
_VERSIONS = b'"versions": ['
_TOKEN_IDS = b'"token_ids": ['
_FIRST_SAMPLED = re.compile(rb"(?:-1, )*(\d+)")  # versions: -1 where not sampled, then the first weight version
CHUNK = 8 << 20  # bytes read at a time when indexing
MAX_PROBLEMS = 50  # problems kept per file (the first ones; the count goes on)
STALE_MIN_S = 120.0  # an unfinished run with no write for max(this, 5 trainer steps) is shown as stopped


@dataclass
class Problem:
    """Something in the run directory that could not be read; shown to the user as `message`."""

    file: str
    line: int
    message: str


class JsonlTail:
    """An append-only JSONL file read incrementally: complete lines only, offsets in bytes."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0  # bytes consumed (always just after a newline)
        self.num_lines = 0
        self.problems: list[Problem] = []
        self.num_bad = 0
        self.pending = 0  # bytes after the last newline: a line being written

    def read_new(self) -> Iterator[tuple[int, int, bytes]]:
        """(line number, byte offset, line) for each complete line appended since the last call.

        Read in chunks of CHUNK bytes, so indexing a file of gigabytes holds one chunk (or one line) at a time."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < self.offset:  # truncated or replaced: start again
            self.offset, self.num_lines, self.num_bad, self.problems = 0, 0, 0, []
        self.pending = 0
        if size == self.offset:
            return
        try:
            f = self.path.open("rb")
        except OSError as err:
            self.problem(0, f"cannot be opened: {err}")
            return
        with f:
            f.seek(self.offset)
            carry = b""
            while self.offset + len(carry) < size:
                data = carry + f.read(min(CHUNK, size - self.offset - len(carry)))
                if len(data) == len(carry):  # the file shrank while we read
                    break
                end = data.rfind(b"\n")
                if end < 0:  # no complete line in this chunk (a long line, or one being written): read on
                    carry = data
                    continue
                pos = 0
                while pos <= end:
                    nl = data.index(b"\n", pos)
                    self.num_lines += 1
                    if nl > pos:
                        yield self.num_lines, self.offset + pos, data[pos:nl]
                    pos = nl + 1
                self.offset += end + 1
                carry = data[end + 1:]
            self.pending = len(carry)

    def problem(self, line: int, message: str) -> None:
        self.num_bad += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(self.path.name, line, message))


class MetricsFile:
    """`metrics.jsonl`: every record that parses as a JSON object, in file order."""

    def __init__(self, path: Path):
        self.tail = JsonlTail(path)
        self.records: list[dict[str, Any]] = []

    def poll(self) -> int:
        """Read what was appended; returns how many records were added."""
        before = len(self.records)
        for num, _, line in self.tail.read_new():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                self.tail.problem(num, f"line {num} is not valid JSON ({err.msg if hasattr(err, 'msg') else err}); "
                                       "it was skipped")
                continue
            if not isinstance(rec, dict):
                self.tail.problem(num, f"line {num} is a JSON {type(rec).__name__}, not an object; it was skipped")
                continue
            self.records.append(rec)
        return len(self.records) - before


def _first_sampled_version(line: bytes, start: int, stop: int) -> int:
    """The weight version of the first sampled token in [start, stop) (versions only grow in a session)."""
    pos = line.find(_VERSIONS, start, stop)
    while pos >= 0:
        m = _FIRST_SAMPLED.match(line, pos + len(_VERSIONS))
        if m:
            return int(m.group(1))
        pos = line.find(_VERSIONS, pos + 1, stop)
    return -1


def _num_tokens(line: bytes, start: int, stop: int) -> int:
    total = 0
    pos = line.find(_TOKEN_IDS, start, stop)
    while pos >= 0:
        a = pos + len(_TOKEN_IDS)
        b = line.index(b"]", a)
        total += line.count(b",", a, b) + 1 if b > a else 0
        pos = line.find(_TOKEN_IDS, b, stop)
    return total


def _fast_summaries(line: bytes) -> list[dict[str, Any]]:
    """Head and tail of each trajectory on a line (one trajectory, or a `{"index", "group": [...]}` row)."""
    out = []
    pos = line.find(b'{"task_id": ')
    if pos < 0:
        raise ValueError("no trajectory on this line")
    while pos >= 0:
        seg = line.find(_SEGMENTS, pos)
        rew = line.find(_REWARD, seg)
        if seg < 0 or rew < 0:
            raise ValueError("not in Trajectory.to_dict layout")
        head = json.loads(line[pos:seg] + b'"_": 0}')
        nxt = line.find(_NEXT_TRAJ, rew)
        tail_end = nxt + 1 if nxt >= 0 else len(line)
        tail, _ = json.JSONDecoder().raw_decode("{" + line[rew:tail_end].decode())
        head.pop("_")
        d = {**head, **tail}
        d["_version"] = _first_sampled_version(line, seg, rew)
        d["_num_tokens"] = _num_tokens(line, seg, rew)
        d["_num_segments"] = line.count(_TOKEN_IDS, seg, rew)
        out.append(d)
        pos = nxt + 3 if nxt >= 0 else -1
    return out


def full_summaries(line: bytes) -> list[dict[str, Any]]:
    row = json.loads(line)
    trajs = row["group"] if isinstance(row, dict) and "group" in row else [row]
    out = []
    for t in trajs:
        t = dict(t)
        segs = t.pop("segments", []) or []
        versions = [v for s in segs for v, m in zip(s.get("versions", []), s.get("loss_mask", [])) if m]
        t["_version"] = min(versions) if versions else -1
        t["_num_tokens"] = sum(len(s.get("token_ids", [])) for s in segs)
        t["_num_segments"] = len(segs)
        out.append(t)
    return out


def summarize_line(line: bytes) -> list[dict[str, Any]]:
    """Small summaries of the trajectories on one JSONL line (fast path, else a full parse)."""
    try:
        return _fast_summaries(line)
    except (ValueError, UnicodeDecodeError):
        return full_summaries(line)


def _row(d: dict[str, Any], bucket_key: str) -> dict[str, Any]:
    """What the rollout browser lists and filters on."""
    reward = d.get("reward") or {}
    tests = reward.get("tests") or {}
    meta = d.get("meta") or {}
    bucket = meta.get(bucket_key) if bucket_key else None
    if bucket is None:
        bucket = meta.get("mutation", meta.get("difficulty", ""))
    components = reward.get("components") or {}
    # rollout.evaluate.solved, on the dict: every hidden test passed (and submitted, when that is required)
    passed = bool(reward) and not components.get("not_submitted") and \
        (components.get("tests", reward.get("value")) or 0) >= 1.0
    return {"task": str(d.get("task_id", "")), "group": str(d.get("group_id", "")),
            "reward": reward.get("value") if reward else None, "passed": passed, "flags": list(reward.get("flags") or []),
            "tests_passed": sum(v == "passed" for v in tests.values()), "tests_total": len(tests),
            "turns": int(d.get("num_turns") or 0), "tool_calls": int(d.get("num_tool_calls") or 0),
            "tool_errors": int(d.get("num_tool_errors") or 0), "env_failure": d.get("env_failure"),
            "sampled_tokens": int(meta.get("num_sampled_tokens") or 0), "tokens": d["_num_tokens"],
            "segments": d["_num_segments"], "version": d["_version"], "bucket": str(bucket or ""),
            "submitted": bool(meta.get("submitted")), "context_full": bool(meta.get("context_full")),
            "summaries": int(meta.get("num_summaries") or 0),
            "total_s": (d.get("timings") or {}).get("total_s")}


class TrajectoryFiles:
    """Every trajectory under `trajectories/`: summaries in memory, the rest left on disk at its offset."""

    def __init__(self, directory: Path, bucket_key: str = ""):
        self.directory = directory
        self.bucket_key = bucket_key
        self.tails: dict[str, JsonlTail] = {}
        self.rows: list[dict[str, Any]] = []
        self.locations: list[tuple[str, int, int, int]] = []  # (file, offset, length, position in group)
        self.groups: dict[str, list[int]] = {}

    def poll(self) -> int:
        before = len(self.rows)
        if not self.directory.is_dir():
            return 0
        for path in sorted(self.directory.glob("*.jsonl")):
            tail = self.tails.setdefault(path.name, JsonlTail(path))
            for num, offset, line in tail.read_new():
                try:
                    summaries = summarize_line(line)
                except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
                    tail.problem(num, f"line {num} is not a trajectory or a group of them ({err}); it was skipped")
                    continue
                for k, d in enumerate(summaries):
                    row = _row(d, self.bucket_key)
                    row["id"] = len(self.rows)
                    self.rows.append(row)
                    self.locations.append((path.name, offset, len(line), k))
                    self.groups.setdefault(row["group"], []).append(row["id"])
        return len(self.rows) - before

    def problems(self) -> list[Problem]:
        return [p for t in self.tails.values() for p in t.problems]

    def load(self, traj_id: int) -> Trajectory:
        """One trajectory, read from its file at its offset."""
        if not 0 <= traj_id < len(self.locations):
            raise KeyError(f"no trajectory {traj_id} (this run has {len(self.locations)})")
        name, offset, length, k = self.locations[traj_id]
        with (self.directory / name).open("rb") as f:
            f.seek(offset)
            row = json.loads(f.read(length))
        d = row["group"][k] if isinstance(row, dict) and "group" in row else row
        return Trajectory.from_dict(d)

    def select(self, *, task: str = "", group: str = "", bucket: str = "", flag: str = "",
               min_reward: float | None = None, max_reward: float | None = None, min_version: int | None = None,
               max_version: int | None = None, min_tokens: int | None = None, max_tokens: int | None = None,
               ) -> list[dict[str, Any]]:
        """Rows matching every filter given (substring match for task; `flag="any"`: any flag raised)."""
        out = []
        for r in self.rows:
            if task and task not in r["task"]:
                continue
            if group and r["group"] != group:
                continue
            if bucket and r["bucket"] != bucket:
                continue
            if flag and not (r["flags"] if flag == "any" else flag in r["flags"]):
                continue
            reward = r["reward"]
            if min_reward is not None and (reward is None or reward < min_reward):
                continue
            if max_reward is not None and (reward is None or reward > max_reward):
                continue
            if min_version is not None and r["version"] < min_version:
                continue
            if max_version is not None and r["version"] > max_version:
                continue
            if min_tokens is not None and r["sampled_tokens"] < min_tokens:
                continue
            if max_tokens is not None and r["sampled_tokens"] > max_tokens:
                continue
            out.append(r)
        return out

    def buckets(self) -> dict[str, dict[str, float]]:
        """Per task bucket: rollouts, mean reward, pass@1, and pass@k over groups (k = the group size)."""
        out: dict[str, dict[str, float]] = {}
        for ids in self.groups.values():
            rows = [self.rows[i] for i in ids if self.rows[i]["reward"] is not None]
            if not rows:
                continue
            b = out.setdefault(rows[0]["bucket"] or "(none)", {"rollouts": 0, "reward_sum": 0.0, "passed": 0,
                                                              "groups": 0, "groups_passed": 0})
            b["rollouts"] += len(rows)
            b["reward_sum"] += sum(r["reward"] for r in rows)
            b["passed"] += sum(r["passed"] for r in rows)
            b["groups"] += 1
            b["groups_passed"] += any(r["passed"] for r in rows)
        return {k: {"rollouts": b["rollouts"], "reward": b["reward_sum"] / b["rollouts"],
                    "pass1": b["passed"] / b["rollouts"], "pass_group": b["groups_passed"] / b["groups"]}
                for k, b in sorted(out.items())}

    def health(self, max_turns: int | None = None) -> dict[str, float]:
        """How sessions ended, as fractions of all rollouts: environment failures (errors outside the policy),
        not submitted, cut at the context limit, at the turn limit (truncation), with an unusable tool call."""
        n = len(self.rows)
        if not n:
            return {}
        out = {"env_failure_rate": sum(r["env_failure"] is not None for r in self.rows) / n,
               "unsubmitted_rate": sum(not r["submitted"] for r in self.rows) / n,
               "context_full_rate": sum(r["context_full"] for r in self.rows) / n,
               "tool_error_rate": sum(r["tool_errors"] > 0 for r in self.rows) / n,
               # self-summarization (rollout/summary_metrics.py has the full set): summaries per session and the
               # share of sessions that submitted after at least one
               "summaries_per_session": sum(r["summaries"] for r in self.rows) / n,
               "finish_after_summary_rate": sum(r["summaries"] > 0 and r["submitted"] for r in self.rows) / n}
        if max_turns:
            out["max_turns_rate"] = sum(r["turns"] >= max_turns for r in self.rows) / n
        return out

    def facets(self) -> dict[str, Any]:
        """The values a filter can take: buckets, flags, version range."""
        versions = [r["version"] for r in self.rows if r["version"] >= 0]
        return {"buckets": sorted({r["bucket"] for r in self.rows if r["bucket"]}),
                "flags": sorted({f for r in self.rows for f in r["flags"]}),
                "versions": [min(versions), max(versions)] if versions else [],
                "count": len(self.rows)}


def _read_json(path: Path, problems: list[Problem]) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        problems.append(Problem(path.name, 0, f"cannot be read as JSON ({err}); it is being written, or broken"))
        return {}
    if not isinstance(data, dict):
        problems.append(Problem(path.name, 0, "is not a JSON object"))
        return {}
    return data


@dataclass
class RunIndex:
    """One run directory: config, summary, metrics and trajectories, refreshed by `poll()`."""

    path: Path
    online_window: int = 32  # feedback events in an online run's live accept rate (online.py)
    open_event_log: EventSourceOpener | None = None  # finds an online run's event log; None: no online view
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    file_problems: list[Problem] = field(default_factory=list)

    def __post_init__(self):
        self.name = self.path.name
        self.metrics = MetricsFile(self.path / "metrics.jsonl")
        self.trajectories = TrajectoryFiles(self.path / "trajectories")
        self.online: OnlineLog | None = None  # an online run's event log (`flywheel serve`), when there is one
        self._stamps: dict[str, float] = {}
        self.open_problem = ""  # why the run's event log could not be opened
        self.last_write_s: float | None = None  # newest mtime of what the run writes as it goes
        self.generation = 0  # counts polls that found something new (caches key on it)
        self.poll()

    def _changed(self, name: str) -> bool:
        try:
            stamp = (self.path / name).stat().st_mtime_ns
        except OSError:
            stamp = -1
        if self._stamps.get(name) == stamp:
            return False
        self._stamps[name] = stamp
        return True

    def poll(self) -> dict[str, int]:
        """Read what changed; returns the numbers of new metrics records, trajectories and online log rows."""
        changed_small = False
        evals = sorted(p.name for p in self.path.glob("eval_*.jsonl"))
        for name in ("config.json", "summary.json", *evals):
            if self._changed(name):
                changed_small = True
        if changed_small:
            self.file_problems = []
            self.config = _read_json(self.path / "config.json", self.file_problems)
            self.summary = _read_json(self.path / "summary.json", self.file_problems)
            orch = self.config.get("orchestrator")
            orch = orch if isinstance(orch, dict) else {}
            self.trajectories.bucket_key = str(orch.get("task_bucket_key") or "")
        if self.online is None and self.open_event_log is not None:
            try:
                source = self.open_event_log(self.path, self.config)
                self.open_problem = ""
            except ValueError as err:  # a bad URL or a missing database driver: a sentence, tried again next poll
                source, self.open_problem = None, str(err)
            if source is not None:
                self.online = OnlineLog(source, self.online_window)
                changed_small = True
        online = 0
        if self.online is not None:
            problem = self.online.problem
            online = self.online.poll()
            online = online or int(self.online.problem != problem)  # a new or cleared problem: the banner changes
        changed = {"records": self.metrics.poll(), "trajectories": self.trajectories.poll(),
                   "files": int(changed_small), "online": online}
        if any(changed.values()):
            self.generation += 1
        self._note_writes()
        return changed

    def _note_writes(self) -> None:
        stamps = []
        for p in [self.path / "metrics.jsonl", *self.trajectories.directory.glob("*.jsonl")]:
            try:
                stamps.append(p.stat().st_mtime)
            except OSError:
                continue
        if self.online is not None and self.online.newest_s is not None:
            stamps.append(self.online.newest_s)
        self.last_write_s = max(stamps) if stamps else None

    def state(self, now: float | None = None) -> dict[str, Any]:
        """Whether the run is still being written: "finished" (its summary holds the RL result), "stopped"
        (interrupted or halted, or no write for a while) or "live", with the reason in words for the badge."""
        now = time.time() if now is None else now
        rl = self.summary.get("rl")
        since = None if self.last_write_s is None else max(0.0, now - self.last_write_s)
        out: dict[str, Any] = {"last_write_s": self.last_write_s, "idle_s": since}
        if isinstance(rl, dict):
            if rl.get("halted"):
                return {**out, "state": "stopped", "why": f"halted by the anti-cheat monitor at step {rl.get('steps')}"}
            if rl.get("interrupted"):
                return {**out, "state": "stopped", "why": f"stopped at step {rl.get('steps')}; resume with --resume"}
            return {**out, "state": "finished", "why": f"finished: {rl.get('steps')} steps"}
        times = [r["time"] for r in self.metrics.records if isinstance(r.get("time"), (int, float))]
        step_s = statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 2 else 0.0
        stale_s = max(STALE_MIN_S, 5 * step_s)
        if since is not None and since > stale_s:
            return {**out, "state": "stopped", "why": f"no new writes for {_ago(since)}"}
        return {**out, "state": "live" if since is not None else "waiting", "why": ""}

    def status(self) -> list[str]:
        """Plain-language problems and notes for the page's banner (empty when all is well)."""
        notes = []
        if not self.path.is_dir():
            return [f"run directory {self.path} is gone"]
        if self.online is not None and self.online.problem:
            notes.append(f"online event log: {self.online.problem}")
        if self.open_problem:
            notes.append(f"online event log: {self.open_problem}")
        if not (self.path / "metrics.jsonl").exists():
            if self.online is None:  # a serving run keeps no metrics.jsonl: its figures are in the event log
                notes.append("no metrics.jsonl yet: the run has not finished its first trainer step "
                             "(or this is not a run directory)")
        elif not self.metrics.records:
            notes.append("metrics.jsonl holds no complete record yet")
        for p in self.file_problems + self.metrics.tail.problems + self.trajectories.problems():
            notes.append(f"{p.file}: {p.message}")
        extra = self.metrics.tail.num_bad - len(self.metrics.tail.problems)
        if extra > 0:
            notes.append(f"metrics.jsonl: {extra} more unreadable lines")
        return notes

    def evals(self) -> dict[str, list[dict[str, Any]]]:
        """Held-out evaluation rows (`eval_<name>.jsonl`: before, after, …), unreadable lines left out."""
        out: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(self.path.glob("eval_*.jsonl")):
            rows = []
            try:
                lines = path.read_bytes().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and "n" in row and "correct" in row:
                    rows.append(row)
            out[path.stem.removeprefix("eval_")] = rows
        return out


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def looks_like_run(path: Path) -> bool:
    """A run directory holds metrics, trajectories, a summary or an online event log (`flywheel serve`), or a
    flywheel config.json (a model directory's config.json, which has no `trainer` section, does not count)."""
    if any((path / n).exists() for n in ("metrics.jsonl", "trajectories", "summary.json", DB_NAME)):
        return True
    try:
        return b'"trainer"' in (path / "config.json").read_bytes()
    except OSError:
        return False


def discover_runs(root: Path, named: frozenset[str] = frozenset()) -> list[Path]:
    """`root` itself when it is a run directory, else its subdirectories that look like runs or are `named`
    (an online run whose event log is on a database server leaves no file that says so), sorted."""
    if looks_like_run(root) or root.name in named:
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p.name in named or looks_like_run(p)))
