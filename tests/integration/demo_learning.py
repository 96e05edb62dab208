"""What a learning run from the demo's base must show, shared by the tests that run one (test_demo_learns.py,
test_remote_learns.py, test_services_learns.py): a held-out pass@1 that rises past MARGIN, every RL step logged,
the report written.

The margin is well under the gains measured for this setting (docs/benchmarks.md: ~+20 points in 14 steps), so a
failure means learning broke, not bad luck.
"""

from __future__ import annotations

import json
from pathlib import Path

STEPS = 14
MARGIN = 0.04


def assert_learned(summary: dict, run_dir: Path, steps: int = STEPS, margin: float = MARGIN) -> None:
    assert summary["rl"]["steps"] == steps and not summary["rl"]["interrupted"]
    before, after = summary["pass1_before"], summary["pass1_after"]
    assert 0.1 <= before <= 0.6, f"the mid-trained base should solve some held-out tasks: pass@1 {before}"
    assert after >= before + margin, f"held-out pass@1 {before:.2f} -> {after:.2f} after {steps} RL steps"
    assert 0 < summary["pass1_gain_se"] < 0.1, summary  # paired over the 100 tasks: about 0.03 here
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert (run_dir / "report.html").exists()
