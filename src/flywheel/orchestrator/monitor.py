"""Anti-cheat flag rates over a sliding window of graded sessions, and the halt they can trigger.

    monitor = FlagMonitor(window=256, halt_rate=0.05)     # env.flag_rate_window, env.halt_on_flag_rate
    monitor.observe(group)                                # every received group, dropped ones included
    monitor.rates()                                       # {"runner_tampered": 0.01, ...} over the window
    monitor.tripped()                                     # ("runner_tampered", 0.07) or None

Why: a reward hack shows first as a rising flag rate (production teams watch exactly this). Each flag already
costs the session its reward, but a policy that learns to cheat wastes the run; past the threshold the loop
stops like a Ctrl-C does (checkpoint, `--resume` goes on) so that a person looks at the transcripts before more
compute is spent. The window restarts empty on resume. Sessions that failed outside the policy (no reward)
are not counted: they were not graded.
"""

from __future__ import annotations

from collections import Counter, deque

from flywheel.types import Trajectory


class FlagMonitor:
    def __init__(self, window: int, halt_rate: float = 0.0) -> None:
        if window < 1:
            raise ValueError(f"env.flag_rate_window must be >= 1, got {window}")
        if not 0.0 <= halt_rate <= 1.0:
            raise ValueError(f"env.halt_on_flag_rate must be in [0, 1], got {halt_rate}")
        self.window, self.halt_rate = window, halt_rate
        self._sessions: deque[frozenset[str]] = deque(maxlen=window)
        self._counts: Counter[str] = Counter()

    def observe(self, group: list[Trajectory]) -> None:
        for t in group:
            if t.reward is None:
                continue
            if len(self._sessions) == self.window:
                self._counts.subtract(self._sessions[0])
            flags = frozenset(t.graded.flags)
            self._sessions.append(flags)
            self._counts.update(flags)

    def rates(self) -> dict[str, float]:
        """Fraction of the window's sessions that raised each flag (flags seen in the window only)."""
        n = len(self._sessions)
        return {f: c / n for f, c in sorted(self._counts.items()) if c > 0} if n else {}

    def tripped(self) -> tuple[str, float] | None:
        """The flag with the highest rate above `halt_rate`, once the window is full; None otherwise."""
        if self.halt_rate <= 0 or len(self._sessions) < self.window:
            return None
        over = [(rate, flag) for flag, rate in self.rates().items() if rate > self.halt_rate]
        if not over:
            return None
        rate, flag = max(over)
        return flag, rate


def step_flag_rates(groups: list[list[Trajectory]]) -> dict[str, float]:
    """`flags/rate/<flag>`: the fraction of the graded sessions received since the last step with that flag."""
    graded = [t for g in groups for t in g if t.reward is not None]
    if not graded:
        return {}
    counts = Counter(f for t in graded for f in set(t.graded.flags))
    return {f"flags/rate/{f}": c / len(graded) for f, c in sorted(counts.items())}
