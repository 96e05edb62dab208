"""Metrics: one JSON object per record in `<run_dir>/metrics.jsonl`, and the same keys to any trackers.

    log = MetricsLog(run_dir, tensorboard=True)
    log.write({"step": 3, "reward/mean": 0.4, "trainer/busy": 0.9})
    log = MetricsLog.from_config(run_dir, cfg.metrics, run_name=cfg.name)   # TensorBoard / W&B / MLflow per config
    log.transcripts(step, batch, decoder)                                    # sample transcripts to the trackers

Why JSONL: append-only, readable while the run goes on, trivially parsed by the report and by tests.
Records are flushed at once so a killed run keeps everything it measured.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from flywheel.config import MetricsConfig
from flywheel.metrics.dashboard.transcript import TokenDecoder, transcript_text, transcript_view
from flywheel.metrics.trackers import TensorBoardTracker, Tracker, build_trackers, scalars
from flywheel.types import Trajectory


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


class MetricsLog:
    def __init__(self, run_dir: str | Path, tensorboard: bool = False, filename: str = "metrics.jsonl",
                 trackers: list[Tracker] | None = None):
        self.trackers: list[Tracker] = list(trackers or [])
        if tensorboard:
            self.trackers.append(TensorBoardTracker(Path(run_dir)))
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    @classmethod
    def from_config(cls, run_dir: str | Path, cfg: MetricsConfig, run_name: str = "run",
                    config: dict | None = None) -> MetricsLog:
        """metrics.jsonl plus the trackers `cfg` enables (metrics/trackers.py)."""
        return cls(run_dir, trackers=build_trackers(cfg, run_dir, run_name, config))

    def write(self, record: dict[str, Any]) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        record.setdefault("time", time.time())
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.trackers and "step" in record:
            values = scalars(record)
            for t in self.trackers:
                t.log_metrics(int(record["step"]), values)

    def transcripts(self, step: int, batch: list[Trajectory], decoder: TokenDecoder | None) -> None:
        """The batch's best and worst rollout, as text, to every tracker (name `transcripts/best`, `/worst`)."""
        graded = [t for t in batch if t.reward is not None]
        if not self.trackers or not graded or decoder is None:
            return
        ranked = sorted(graded, key=lambda t: t.graded.value)
        for name, traj in (("best", ranked[-1]), ("worst", ranked[0])):
            text = transcript_text(transcript_view(traj, decoder))
            for t in self.trackers:
                t.log_text(step, f"transcripts/{name}", text)

    def close(self) -> None:
        self._file.close()
        for t in self.trackers:
            t.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (killed writer) is skipped."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
