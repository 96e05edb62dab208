"""API keys (stored hashed) and per-key rate limits.

    key, rec = new_key("alice", requests_per_min=60, max_body_bytes=65536)   # show `key` once, store `rec`
    log.add_key(rec); hash_key(key) == rec.key_hash
    limiter = RateLimiter(); limiter.allow(rec.key_id, rec.requests_per_min)  # -> (allowed, retry_after_s)

Why sha256 and not a slow password hash: a key is 32 random bytes (256 bits of entropy), so no dictionary or brute
force applies, and an unsalted digest lets the server find a key by an indexed equality lookup on every request.
The database never holds a usable key. Rate limits are token buckets per key (burst = the per-minute allowance),
here in the serving process; `online.serve.rate_limit = "shared"` keeps them in the event log's database instead
(`EventLog.take_token`), one bucket per key for every host.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

from flywheel.online.events import KeyRecord

KEY_PREFIX = "fw-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key(name: str, requests_per_min: int, max_body_bytes: int) -> tuple[str, KeyRecord]:
    """A fresh secret key and the record to store (its hash, never the key)."""
    if not name or len(name) > 200:
        raise ValueError("an API key needs a name of 1 to 200 characters")
    if requests_per_min < 1 or max_body_bytes < 1024:
        raise ValueError("requests_per_min must be >= 1 and max_body_bytes >= 1024")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, KeyRecord(key_id="key-" + secrets.token_hex(8), name=name, key_hash=hash_key(key),
                          requests_per_min=requests_per_min, max_body_bytes=max_body_bytes)


class RateLimiter:
    """Token buckets: each key holds up to `per_min` requests and regains `per_min / 60` per second."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key_id -> (tokens, last time)
        self._lock = threading.Lock()

    def allow(self, key_id: str, per_min: int) -> tuple[bool, float]:
        """(True, 0) and one token spent, or (False, seconds until a token is back)."""
        now = self._clock()
        rate = per_min / 60.0
        with self._lock:
            tokens, last = self._buckets.get(key_id, (float(per_min), now))
            tokens = min(float(per_min), tokens + (now - last) * rate)
            if tokens >= 1.0:
                self._buckets[key_id] = (tokens - 1.0, now)
                return True, 0.0
            self._buckets[key_id] = (tokens, now)
            return False, (1.0 - tokens) / rate
