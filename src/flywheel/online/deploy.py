"""Deploys and rollbacks: the event log says which version serves; every server follows it through the store.

    deployed_version(log.events(("deploy", "rollback")))       # the version that should serve now (pure)
    rollback_target(events)                                     # what a rollback would go back to
    rollback(log, reason="…")                                   # `flywheel deploy rollback` (an event)
    follower = DeploymentFollower(log, subscriber, engine); await follower.run(poll_s)   # inside `flywheel serve`
    monitor = LiveMonitor(window=32, drop=0.2); monitor.observe(version, reward) -> "roll back because …" | None

Why so. A deploy is an event (`deploy`, version, reason) appended to the durable log, a rollback another
(`rollback`, the version it returns to, reason). The deployed version is a pure function of that history: a
stack of deploys, each rollback pops the top. Every serving process, on any host, polls the log and installs the
deployed version through the weight store's verified path (`Subscriber.poll(target)`), which validates and copies
the tensors first and swaps them between two decode steps (inference/local.py): requests in flight finish, the
tokens after the swap carry the new version, none is dropped. A rollback is the same move to an older version.

The live monitor compares the mean reward of the feedback on a new version's completions, over a window, with
the version it replaced; a drop past the threshold rolls back automatically, with the figures as the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from flywheel.online.events import Event, EventLog

log = logging.getLogger(__name__)


def deploy_stack(events: list[Event]) -> list[int]:
    """Versions deployed and not rolled back, oldest first (the top serves)."""
    stack: list[int] = []
    for ev in events:
        if ev.kind == "deploy" and ev.version is not None:
            stack.append(ev.version)
        elif ev.kind == "rollback" and len(stack) > 1:
            stack.pop()
    return stack


def deployed_version(events: list[Event]) -> int | None:
    stack = deploy_stack(events)
    return stack[-1] if stack else None


def rollback_target(events: list[Event]) -> int | None:
    """The version a rollback now returns to, or None when only one version was ever deployed."""
    stack = deploy_stack(events)
    return stack[-2] if len(stack) > 1 else None


def rollback(elog: EventLog, reason: str, data: dict[str, Any] | None = None) -> Event:
    """Append a rollback to the previous deployed version; ValueError when there is none."""
    if not reason.strip():
        raise ValueError("a rollback needs a reason (it is recorded with the event)")
    events = elog.events(("deploy", "rollback"))
    target = rollback_target(events)
    if target is None:
        raise ValueError("nothing to roll back to: only one version has been deployed")
    return elog.append_event("rollback", target, reason, {"from_version": deployed_version(events), **(data or {})})


@dataclass
class Install:
    version: int
    event_seq: int
    event_s: float  # when the deploy/rollback event was written
    installed_s: float  # when this server serves it
    pause_ms: float


@dataclass
class DeploymentFollower:
    """Keeps `engine` on the log's deployed version (subscriber: weights.sync.Subscriber on the store)."""

    elog: EventLog
    subscriber: Any
    engine: Any
    installs: list[Install] = field(default_factory=list)
    last_error: str = ""

    def step(self) -> Install | None:
        """One poll (blocking: run it in a thread). Installs the deployed version if the engine is elsewhere."""
        events = self.elog.events(("deploy", "rollback"))
        target = deployed_version(events)
        if target is None or target == self.engine.version:
            return None
        ev = [e for e in events if e.version == target][-1]
        got = self.subscriber.poll(target)
        if got is None:
            self.last_error = f"could not install version {target}: {self.subscriber.last_error}"
            log.warning(self.last_error)
            return None
        m = self.subscriber.metrics[-1] if self.subscriber.metrics else {}
        inst = Install(target, ev.seq, ev.created_s, time.time(), float(m.get("pause_ms", 0.0)))
        self.installs.append(inst)
        log.info("serving version %d (%s)", target, ev.reason)
        return inst

    async def run(self, poll_s: float) -> None:
        while True:
            try:
                await asyncio.to_thread(self.step)
            except Exception as err:  # noqa: BLE001 - a bad version or a database hiccup never stops serving
                self.last_error = f"{type(err).__name__}: {err}"
                log.exception("deployment follower")
            await asyncio.sleep(poll_s)


class LiveMonitor:
    """Mean reward per served version over the newest `window` feedback events; flags a drop after a deploy."""

    def __init__(self, window: int, drop: float, min_fraction: float = 1.0):
        if window < 1 or drop <= 0:
            raise ValueError("the live monitor needs window >= 1 and drop > 0")
        self.window, self.drop = window, drop
        self.min_count = max(1, int(round(window * min_fraction)))
        self.rewards: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def observe(self, version: int, reward: float) -> None:
        self.rewards[version].append(reward)

    def mean(self, version: int) -> float | None:
        r = self.rewards.get(version)
        return sum(r) / len(r) if r else None

    def verdict(self, current: int, previous: int | None) -> str | None:
        """A reason to roll `current` back to `previous`, or None."""
        if previous is None:
            return None
        cur, prev = self.rewards.get(current), self.rewards.get(previous)
        if not cur or len(cur) < self.min_count or not prev:
            return None
        m_cur, m_prev = sum(cur) / len(cur), sum(prev) / len(prev)
        if m_cur < m_prev - self.drop:
            return (f"live reward of version {current} fell to {m_cur:.3f} over {len(cur)} feedback events, "
                    f"{m_prev - m_cur:.3f} below version {previous} ({m_prev:.3f} over {len(prev)}); threshold "
                    f"{self.drop}")
        return None
