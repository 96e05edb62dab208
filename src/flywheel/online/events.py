"""The durable event log of the online loop: API keys, served completions, feedback, deploy events.

    log = EventLog("sqlite:///runs/online/online.db")          # or "postgresql+psycopg://user@host/db", or a path
    log.add_key(key_id, name, key_hash, requests_per_min=600, max_body_bytes=1 << 20)
    log.record_completion(CompletionRecord(...))                # committed (fsync'd) when it returns
    log.record_feedback(FeedbackRecord(...)); log.feedback_after(seq)
    log.append_event("deploy", version=3, reason="gate passed: ...")

    reader = EventLogReader("runs/online/online.db")            # read-only: what `flywheel dashboard` watches
    with reader.snapshot() as snap:                             # one read transaction: every table at one moment
        tops = snap.tops(); snap.feedback_between(0, tops["feedback"], limit=5000)

Why so. Every write is one transaction that has committed when the call returns, and the server answers a
request only after that: what a client was told is durable. SQLite runs in WAL mode with `synchronous=FULL`, so a
committed transaction survives `kill -9` of the process (and a power cut: the WAL is fsync'd at each commit);
`busy_timeout` lets a second process (the learner, `flywheel deploy`) share the file. PostgreSQL (through the same
SQLAlchemy Core statements) serves several hosts. Token ids, log-probs and versions are stored as JSON arrays:
the learner trains on exactly the tokens that were served, never on a re-tokenization of their text.
`EventLogReader` opens the same tables for a watcher that must never write (the dashboard): no table creation,
no pragma, SQLite in `mode=ro`, PostgreSQL in READ ONLY transactions, and each poll one snapshot.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_online_events.py tests/integration/test_online_server.py`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    case,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

METADATA = MetaData()

API_KEYS = Table(
    "api_keys", METADATA,
    Column("key_id", String(40), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("requests_per_min", Integer, nullable=False),
    Column("max_body_bytes", Integer, nullable=False),
    Column("revoked", Boolean, nullable=False, default=False),
    Column("created_s", Float, nullable=False),
)

COMPLETIONS = Table(
    "completions", METADATA,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("key_id", String(40), nullable=False, index=True),
    Column("created_s", Float, nullable=False),
    Column("model", String(200), nullable=False),
    Column("version", Integer, nullable=False, index=True),
    Column("prompt_ids", JSON, nullable=False),
    Column("token_ids", JSON, nullable=False),
    Column("logprobs", JSON, nullable=False),
    Column("versions", JSON, nullable=False),
    Column("finish_reason", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("meta", JSON, nullable=False),
)

FEEDBACK = Table(
    "feedback", METADATA,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("completion_id", String(64), nullable=False, index=True),
    Column("key_id", String(40), nullable=False),
    Column("signal", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("diff", Text, nullable=False),
    Column("created_s", Float, nullable=False),
)

EVENTS = Table(
    "events", METADATA,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(32), nullable=False, index=True),
    Column("version", Integer, nullable=True),
    Column("reason", Text, nullable=False),
    Column("data", JSON, nullable=False),
    Column("created_s", Float, nullable=False),
)

RATE_BUCKETS = Table(  # `online.serve.rate_limit = "shared"`: one token bucket per key for every host
    "rate_buckets", METADATA,
    Column("key_id", String(40), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("last_s", Float, nullable=False),
    Column("allowed", Boolean, nullable=False),  # the outcome of the last take (read back with RETURNING)
)

EVENT_KINDS = ("deploy", "rollback", "candidate", "gate_pass", "gate_reject", "learner_reset")


@dataclass
class KeyRecord:
    key_id: str
    name: str
    key_hash: str
    requests_per_min: int
    max_body_bytes: int
    revoked: bool = False
    created_s: float = 0.0


@dataclass
class CompletionRecord:
    """One served completion, token-exact: `prompt_ids + token_ids` is what the learner trains on."""

    id: str
    key_id: str
    model: str
    version: int  # the oldest version among `versions` (a deploy may land mid-generation)
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)
    created_s: float = 0.0
    seq: int = 0


@dataclass
class FeedbackRecord:
    id: str
    completion_id: str
    key_id: str
    signal: str
    message: str = ""
    diff: str = ""
    created_s: float = 0.0
    seq: int = 0


@dataclass
class Event:
    kind: str
    version: int | None
    reason: str
    data: dict[str, Any] = field(default_factory=dict)
    created_s: float = 0.0
    seq: int = 0


class DuplicateError(ValueError):
    """A record with this id already exists."""


def database_url(url_or_path: str | Path) -> str:
    """A SQLAlchemy URL: URLs pass through, a plain path becomes `sqlite:///<absolute path>`."""
    s = str(url_or_path)
    if "://" in s:
        return s
    if not s:
        raise ValueError("the event log needs a database: set online.serve.db_url to a SQLAlchemy URL or a file path")
    p = Path(s).expanduser().resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{p}"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")  # each commit fsyncs the WAL: committed = on disk
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _new_id(result: Any) -> int:
    key = result.inserted_primary_key
    assert key is not None, "an INSERT returns the new row's primary key"
    return int(key[0])


class EventLog:
    """Keys, completions, feedback and events in one SQL database (SQLite WAL or PostgreSQL)."""

    def __init__(self, url: str | Path):
        self.url = database_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        try:
            self.engine: Engine = create_engine(self.url, pool_pre_ping=not self.is_sqlite,
                                                connect_args={"timeout": 30} if self.is_sqlite else {})
        except Exception as err:  # noqa: BLE001 - a bad URL or a missing driver surfaces as many types
            raise ValueError(f"cannot open the event log '{self.url}': {type(err).__name__}: {err} (for PostgreSQL "
                             f"install the `postgres` extra and use postgresql+psycopg://user@host:port/db)") from None
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        METADATA.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ---- keys -------------------------------------------------------------------------------------

    def add_key(self, rec: KeyRecord) -> None:
        rec.created_s = rec.created_s or time.time()
        try:
            with self.engine.begin() as c:
                c.execute(insert(API_KEYS).values(**asdict(rec)))
        except IntegrityError:
            raise DuplicateError(f"API key '{rec.key_id}' (or its hash) already exists") from None

    def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        with self.engine.connect() as c:
            row = c.execute(select(API_KEYS).where(API_KEYS.c.key_hash == key_hash)).mappings().first()
        return KeyRecord(**row) if row else None

    def revoke_key(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (servers refuse it within `online.serve.key_recheck_s`); ValueError if unknown."""
        with self.engine.begin() as c:
            if c.execute(update(API_KEYS).where(API_KEYS.c.key_id == key_id).values(revoked=True)).rowcount != 1:
                raise ValueError(f"no API key '{key_id}' (`flywheel keys list` shows them)")
            row = c.execute(select(API_KEYS).where(API_KEYS.c.key_id == key_id)).mappings().one()
        return KeyRecord(**row)

    def take_token(self, key_id: str, per_min: int, now: float | None = None) -> tuple[bool, float]:
        """The shared token bucket of `key_id` (capacity `per_min`, refilled at `per_min / 60` per second):
        (True, 0) and one token spent, or (False, seconds until one is back). One UPDATE ... RETURNING per call,
        atomic on SQLite and PostgreSQL alike, so hosts racing on one key never spend the same token twice.
        Clock skew between hosts never refills a bucket backwards (elapsed time is clamped at 0)."""
        now = time.time() if now is None else now
        cap, rate = float(per_min), per_min / 60.0
        b = RATE_BUCKETS.c
        grown = b.tokens + case((b.last_s < now, (now - b.last_s) * rate), else_=0.0)
        refill = case((grown > cap, cap), else_=grown)
        stmt = (update(RATE_BUCKETS).where(b.key_id == key_id)
                .values(tokens=case((refill >= 1.0, refill - 1.0), else_=refill), last_s=now, allowed=refill >= 1.0)
                .returning(b.tokens, b.allowed))
        for _ in range(2):
            with self.engine.begin() as c:
                row = c.execute(stmt).first()
                if row is None:
                    try:
                        with c.begin_nested():
                            c.execute(insert(RATE_BUCKETS).values(key_id=key_id, tokens=cap - 1.0, last_s=now,
                                                                  allowed=True))
                        return True, 0.0
                    except IntegrityError:  # another host made the bucket first: take from it
                        continue
            tokens, allowed = float(row[0]), bool(row[1])
            return (True, 0.0) if allowed else (False, (1.0 - tokens) / rate)
        raise RuntimeError(f"the rate bucket of key '{key_id}' could neither be read nor created")

    def keys(self) -> list[KeyRecord]:
        with self.engine.connect() as c:
            return [KeyRecord(**r) for r in c.execute(select(API_KEYS).order_by(API_KEYS.c.created_s)).mappings()]

    # ---- completions and feedback ----------------------------------------------------------------

    def record_completion(self, rec: CompletionRecord) -> None:
        rec.created_s = rec.created_s or time.time()
        values = {k: v for k, v in asdict(rec).items() if k != "seq"}
        try:
            with self.engine.begin() as c:
                rec.seq = _new_id(c.execute(insert(COMPLETIONS).values(**values)))
        except IntegrityError:
            raise DuplicateError(f"completion '{rec.id}' already exists") from None

    def completion(self, completion_id: str) -> CompletionRecord | None:
        with self.engine.connect() as c:
            row = c.execute(select(COMPLETIONS).where(COMPLETIONS.c.id == completion_id)).mappings().first()
        return CompletionRecord(**row) if row else None

    def completions(self, after_seq: int = 0, limit: int = 100_000) -> list[CompletionRecord]:
        with self.engine.connect() as c:
            rows = c.execute(select(COMPLETIONS).where(COMPLETIONS.c.seq > after_seq)
                             .order_by(COMPLETIONS.c.seq).limit(limit)).mappings().all()
        return [CompletionRecord(**r) for r in rows]

    def record_feedback(self, rec: FeedbackRecord) -> None:
        rec.created_s = rec.created_s or time.time()
        values = {k: v for k, v in asdict(rec).items() if k != "seq"}
        try:
            with self.engine.begin() as c:
                rec.seq = _new_id(c.execute(insert(FEEDBACK).values(**values)))
        except IntegrityError:
            raise DuplicateError(f"feedback '{rec.id}' already exists") from None

    def feedback_after(self, after_seq: int, limit: int = 10_000) -> list[tuple[FeedbackRecord, CompletionRecord]]:
        """Feedback events with seq > after_seq, oldest first, each with the completion it is about."""
        f, cpl = FEEDBACK, COMPLETIONS
        cols = [f.c[n].label(f"f_{n}") for n in f.c.keys()] + [cpl.c[n].label(f"c_{n}") for n in cpl.c.keys()]
        q = (select(*cols).join_from(f, cpl, f.c.completion_id == cpl.c.id).where(f.c.seq > after_seq)
             .order_by(f.c.seq).limit(limit))
        with self.engine.connect() as c:
            rows = c.execute(q).mappings().all()
        return [(FeedbackRecord(**{k[2:]: v for k, v in r.items() if k.startswith("f_")}),
                 CompletionRecord(**{k[2:]: v for k, v in r.items() if k.startswith("c_")})) for r in rows]

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as c:
            return _tops(c)

    # ---- deploy events ----------------------------------------------------------------------------

    def append_event(self, kind: str, version: int | None, reason: str, data: dict[str, Any] | None = None) -> Event:
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind '{kind}' is not one of {list(EVENT_KINDS)}")
        ev = Event(kind, version, reason, json.loads(json.dumps(data or {})), time.time())
        with self.engine.begin() as c:
            ev.seq = _new_id(c.execute(insert(EVENTS).values(kind=ev.kind, version=ev.version, reason=ev.reason,
                                                             data=ev.data, created_s=ev.created_s)))
        return ev

    def events(self, kinds: tuple[str, ...] | None = None, after_seq: int = 0) -> list[Event]:
        q = select(EVENTS).where(EVENTS.c.seq > after_seq)
        if kinds:
            q = q.where(EVENTS.c.kind.in_(kinds))
        with self.engine.connect() as c:
            return [Event(**r) for r in c.execute(q.order_by(EVENTS.c.seq)).mappings()]


def _tops(c: Connection) -> dict[str, int]:
    """The newest seq of completions, feedback and events (0 for an empty table)."""
    return {t.name: int(c.execute(select(t.c.seq).order_by(t.c.seq.desc()).limit(1)).scalar() or 0)
            for t in (COMPLETIONS, FEEDBACK, EVENTS)}


class EventLogUnreadable(RuntimeError):
    """The log could not be read; the message is the database's own (`no such table: events`, `database is
    locked`, `file is not a database`, a refused connection)."""


class LogSnapshot:
    """The reads of one poll, inside one read transaction (EventLogReader.snapshot): rows in (after, upto]."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def tops(self) -> dict[str, int]:
        return _tops(self.conn)

    def events_between(self, after: int, upto: int) -> list[Event]:
        q = select(EVENTS).where(EVENTS.c.seq > after, EVENTS.c.seq <= upto).order_by(EVENTS.c.seq)
        return [Event(**r) for r in self.conn.execute(q).mappings()]

    def completions_by_version(self, after: int, upto: int) -> list[tuple[int, int]]:
        """(version, number of completions) of the completions in (after, upto]: counted by the database."""
        c = COMPLETIONS.c
        q = select(c.version, func.count()).where(c.seq > after, c.seq <= upto).group_by(c.version)
        return [(int(v), int(n)) for v, n in self.conn.execute(q)]

    def feedback_between(self, after: int, upto: int, limit: int) -> list[tuple[int, str, float, int | None]]:
        """(seq, signal, created_s, version of the completion it is about, None if unknown), oldest first, at
        most `limit`: only the columns a watcher folds into counters, never the token arrays."""
        f, c = FEEDBACK.c, COMPLETIONS.c
        q = (select(f.seq, f.signal, f.created_s, c.version).join_from(FEEDBACK, COMPLETIONS, f.completion_id == c.id,
                                                                        isouter=True)
             .where(f.seq > after, f.seq <= upto).order_by(f.seq).limit(limit))
        return [(int(s), str(sig), float(t), None if v is None else int(v)) for s, sig, t, v in self.conn.execute(q)]


class EventLogReader:
    """An event log opened to be watched, never written: SQLite (a path or `sqlite:///…`) or PostgreSQL.

    EventLog creates its tables and sets WAL mode when it opens a log: writes a watcher must not make. Here SQLite
    is opened with `mode=ro` (this process cannot write, whatever a bug asks) and a busy timeout of
    `busy_timeout_s`, and `snapshot()` runs BEGIN … COMMIT around its reads, which in WAL mode is one snapshot
    that never blocks a writer; PostgreSQL gets REPEATABLE READ, READ ONLY transactions: one snapshot, no write.
    `path` is the SQLite file (None on a server): a watcher that sees it replaced by a new file starts again."""

    def __init__(self, url: str | Path, busy_timeout_s: float = 2.0):
        s = str(url)
        self.url = s if "://" in s else f"sqlite:///{Path(s).expanduser().resolve()}"
        parsed = make_url(self.url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.path: Path | None = Path(parsed.database or "").resolve() if self.is_sqlite else None
        self.name = self.path.name if self.path is not None else parsed.render_as_string(hide_password=True)
        self.busy_timeout_s = busy_timeout_s
        try:
            if self.path is not None:
                file_uri = f"{self.path.as_uri()}?mode=ro"
                self.engine: Engine = create_engine(self.url, creator=lambda: sqlite3.connect(
                    file_uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False))
                # the driver leaves transactions to us (isolation_level None): BEGIN makes the reads one snapshot
                event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
            else:
                self.engine = create_engine(self.url, pool_pre_ping=True,
                                            connect_args={"connect_timeout": max(1, round(busy_timeout_s))})
        except Exception as err:  # noqa: BLE001 - a bad URL or a missing driver surfaces as many types
            raise ValueError(f"cannot open the event log '{self.name}': {type(err).__name__}: {err}") from None

    def close(self) -> None:
        """Drop the open connections (the next snapshot opens new ones: after an error, or a replaced file)."""
        self.engine.dispose()

    @contextmanager
    def snapshot(self) -> Iterator[LogSnapshot]:
        """One read transaction; any database error becomes EventLogUnreadable with the database's message."""
        try:
            with self.engine.connect() as conn:
                if not self.is_sqlite:
                    conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                with conn.begin():
                    yield LogSnapshot(conn)
        except DBAPIError as err:
            raise EventLogUnreadable(str(err.orig).strip()) from None
        except SQLAlchemyError as err:
            raise EventLogUnreadable(str(err).strip()) from None
