"""Waiting on a server from a test: `wait_for(lambda: srv.status(key)["pool"]["groups"] > 0, 60, "a group")`
returns the first truthy value of the condition, or fails the test saying what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
