"""Metrics: one JSON object per record in `<run_dir>/metrics.jsonl`, optionally TensorBoard too.

    log = MetricsLog(run_dir, tensorboard=True)
    log.write({"step": 3, "reward/mean": 0.4, "trainer/busy": 0.9})

Why JSONL: append-only, readable while the run goes on, trivially parsed by the report and by tests.
Records are flushed at once so a killed run keeps everything it measured.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


class MetricsLog:
    def __init__(self, run_dir: str | Path, tensorboard: bool = False, filename: str = "metrics.jsonl"):
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("metrics.tensorboard = true needs the tensorboard package: "
                                 "pip install 'flywheel[tensorboard]', or set metrics.tensorboard = false") from err
            self._tb = SummaryWriter(str(Path(run_dir) / "events"))
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        record.setdefault("time", time.time())
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None and "step" in record:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "time"):
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (killed writer) is skipped."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
