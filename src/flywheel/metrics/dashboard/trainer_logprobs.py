"""The trainer's recomputed log-probs of a sample of trained trajectories, for the mismatch colouring.

    writer = TrainerLogprobsWriter(run_dir)                       # trainer side (orchestrator/trainer_service.py)
    writer.write(step, traj, trainer.recomputed_logprobs(i))      # one line: Δ log p per token, per segment
    index = TrainerLogprobs(run_dir); index.poll()                # dashboard side: key -> line offset
    record = index.get(trajectory_key(traj))                      # {"step", "dlogp": [[Δ per sampled token]]}

Why a file of its own (`<run_dir>/trainer_logprobs.jsonl`): a trajectory is appended to `trajectories/` when it is
admitted, before the trainer has seen it, and that log is what a resume replays, so it is never rewritten. The
trainer's log-probs (the "old" log-probs its off-policy correction weighs against the sampler's) exist only after
the step; they are written here for `metrics.trainer_logprobs_per_step` trajectories per step (0 = none, -1 = the
whole batch), spread over the batch, and matched to their transcript by `trajectory_key` (a hash of the group id
and every token id), so no trajectory type changes and a line never needs the admitted log's offsets.

What a line holds: `dlogp`, per segment, Δ log p = trainer log-prob − sampler log-prob of each sampled token
(loss mask 1) in order (3 significant digits: the colouring needs the magnitude, and an exact 0, which
batch-invariant mode gives, stays 0; `null` where the trainer has none). Prompt and tool-output tokens take no
room. Cost: ~8 bytes per sampled token of the written sample.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flywheel.metrics.dashboard.runindex import JsonlTail
from flywheel.types import Trajectory

FILE = "trainer_logprobs.jsonl"


def trajectory_key(traj: Trajectory) -> str:
    """A stable id of a trajectory's content: its group id and the token ids of every segment."""
    h = hashlib.blake2b(traj.group_id.encode(), digest_size=12)
    for seg in traj.segments:
        h.update(b"|" + ",".join(map(str, seg.token_ids)).encode())
    return h.hexdigest()


def sample_indices(num_trajectories: int, num_kept: int) -> list[int]:
    """Which of a batch's trajectories to write: `num_kept` spread evenly (all when -1 or more than the batch)."""
    if num_kept < 0 or num_kept >= num_trajectories:
        return list(range(num_trajectories))
    if num_kept == 0:
        return []
    if num_kept == 1:
        return [0]
    return sorted({round(i * (num_trajectories - 1) / (num_kept - 1)) for i in range(num_kept)})


def logprob_deltas(traj: Trajectory, trainer_logprobs: list[list[float | None]]) -> list[list[float | None]]:
    """Per segment, Δ log p = trainer − sampler (3 significant digits) of each sampled token (loss mask 1) in
    order; None where the trainer has no log-prob."""
    out = []
    for seg, lps in zip(traj.segments, trainer_logprobs):
        out.append([None if lp is None else float(f"{lp - s:.3g}")
                    for lp, s, m in zip(lps, seg.logprobs, seg.loss_mask) if m])
    return out


class TrainerLogprobsWriter:
    """Appends one line per written trajectory to `<run_dir>/trainer_logprobs.jsonl` (flushed per step)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, items: list[tuple[Trajectory, list[list[float | None]]]]) -> int:
        """Write (trajectory, its trainer log-probs per segment) pairs of trainer step `step`; returns the bytes."""
        lines = [json.dumps({"key": trajectory_key(t), "step": step, "group": t.group_id,
                             "dlogp": logprob_deltas(t, lps)}) + "\n" for t, lps in items]
        if not lines:
            return 0
        data = "".join(lines)
        with self.path.open("a") as f:
            f.write(data)
        return len(data)


class TrainerLogprobs:
    """The dashboard's index of `trainer_logprobs.jsonl`: key -> (offset, length), read incrementally."""

    def __init__(self, run_dir: Path):
        self.tail = JsonlTail(Path(run_dir) / FILE)
        self.offsets: dict[str, tuple[int, int]] = {}

    def poll(self) -> int:
        before = len(self.offsets)
        for num, offset, line in self.tail.read_new():
            try:
                key = json.loads(line)["key"]
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                self.tail.problem(num, f"line {num} is not a trainer log-prob record ({err}); it was skipped")
                continue
            self.offsets[str(key)] = (offset, len(line))
        return len(self.offsets) - before

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of trajectory `key` (`step`, `dlogp`), or None when the trainer wrote none for it."""
        where = self.offsets.get(key)
        if where is None:
            return None
        try:
            with self.tail.path.open("rb") as f:
                f.seek(where[0])
                rec = json.loads(f.read(where[1]))
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and isinstance(rec.get("dlogp"), list) else None
