"""A reduced demo learns through vLLM: configs/examples/vllm.toml's settings on the demo's base, 8 async steps.

    .venv/bin/python -m pytest -q tests/integration/test_vllm_learns.py     # builds the demo base if alone

The demo's config with `inference.type = "vllm"`: rollouts and the held-out evaluation after RL come from a
vLLM server flywheel launches from .venv-vllm, every new version enters it through the weight store's deltas
(the worker extension), and held-out pass@1 must rise. Before is the base's score from the shared `demo_base`
(the local engine, same sampling). Measured: +0.148 in 8 steps on the Ray backend, +0.247 in 16 on the local
one (docs/inference.md); the margin is the demo test's.
"""

import json
from pathlib import Path

import pytest

from flywheel.pipeline.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.vllm, pytest.mark.timeout(1800)]

STEPS = 8
MARGIN = 0.04
VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def test_reduced_demo_learns_through_vllm(demo_base, tmp_path):
    run_dir = tmp_path / "vllm"
    demo_base.seed_summary(run_dir)
    cfg = demo_base.config(run_dir, "--trainer.num_steps", str(STEPS), "--inference.type", "vllm",
                           "--inference.vllm.python", str(VLLM_PYTHON), "--inference.vllm.num_threads", "1")
    summary = run_job(cfg, show_progress=False)
    assert summary["rl"]["steps"] == STEPS and not summary["rl"]["interrupted"]
    before, after = summary["pass1_before"], summary["pass1_after"]
    assert after >= before + MARGIN, f"held-out pass@1 {before:.2f} -> {after:.2f} after {STEPS} RL steps on vLLM"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert summary["rl"]["node/version"] >= STEPS - 2  # the server followed the trainer through the store
    assert "==== flywheel" in (run_dir / "cache" / "vllm-node0.log").read_text()  # rollouts came from vLLM
