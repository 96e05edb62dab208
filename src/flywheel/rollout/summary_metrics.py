"""Self-summarization metrics over graded sessions: how often they summarize, what a summary costs and buys.

    m = summary_metrics(trajectories, max_seq_len=1024)
    m["finish_after_summary_rate"], m["pass1_by_summaries"]["1"], m["tokens_processed_per_session_p50"]

Read from what the agent loop records (rollout/agent.py): `meta["summaries"]` (context tokens before and after
each summary, the problem found, the facts kept), `meta["context_full"]`, the segments. `tokens processed` is
the sum of every segment's length: the context the model worked through, against one window of `max_seq_len`.
A session *finishes* when it submits; `finish_after_summary_rate` is the share of all sessions that submitted
after at least one summary. pass@1 is split by the number of summaries (0, 1, 2+), each over its own sessions.
"""

from __future__ import annotations

import statistics

from flywheel.rollout.evaluate import solved
from flywheel.types import Trajectory


def tokens_processed(traj: Trajectory) -> int:
    return sum(len(s.token_ids) for s in traj.segments)


def _bucket(n: int) -> str:
    return "2+" if n >= 2 else str(n)


def summary_metrics(trajs: list[Trajectory], max_seq_len: int | None = None) -> dict:
    """The figures of the module docstring over the graded sessions of `trajs` (empty dict when none)."""
    graded = [t for t in trajs if t.reward is not None]
    if not graded:
        return {}
    counts = [int(t.meta.get("num_summaries", 0)) for t in graded]
    records = [r for t in graded for r in t.meta.get("summaries", [])]
    processed = [tokens_processed(t) for t in graded]
    by: dict[str, list[bool]] = {}
    for t, n in zip(graded, counts):
        by.setdefault(_bucket(n), []).append(solved(t))
    out: dict = {
        "num_sessions": len(graded),
        "summaries_per_session": statistics.fmean(counts),
        "summarized_rate": sum(n > 0 for n in counts) / len(graded),
        "finish_after_summary_rate": sum(n > 0 and bool(t.meta.get("submitted")) for t, n in zip(graded, counts))
        / len(graded),
        "solved_after_summary_rate": sum(n > 0 and solved(t) for t, n in zip(graded, counts)) / len(graded),
        "context_full_rate": sum(bool(t.meta.get("context_full")) for t in graded) / len(graded),
        "pass1_by_summaries": {k: sum(v) / len(v) for k, v in sorted(by.items())},
        "sessions_by_summaries": {k: len(v) for k, v in sorted(by.items())},
        "tokens_processed_per_session_p50": statistics.median(processed),
        "tokens_processed_per_session_max": max(processed),
    }
    if records:
        out["tokens_before_summary_mean"] = statistics.fmean(r["tokens_before"] for r in records)
        out["tokens_after_summary_mean"] = statistics.fmean(r["tokens_after"] for r in records)
        out["summary_facts_kept_mean"] = statistics.fmean(r["facts_kept"] for r in records)
        out["summary_problem_rate"] = sum(r["problem"] is not None for r in records) / len(records)
    if max_seq_len:
        out["max_seq_len"] = max_seq_len
        out["tokens_processed_over_window_p50"] = out["tokens_processed_per_session_p50"] / max_seq_len
        long_solved = [p for p, t, n in zip(processed, graded, counts) if n >= 2 and solved(t)]
        if long_solved:  # the target: sessions solved after >= 2 summaries process > 3 windows
            out["tokens_processed_solved_2plus_p50_over_window"] = statistics.median(long_solved) / max_seq_len
    return out
