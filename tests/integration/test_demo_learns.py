"""A reduced demo learns: the demo's config end to end, with fewer RL steps, raises held-out pass@1.

Everything real: synthetic tasks, the tokenizer, mid-training on transcripts run through the harness (the
session's shared `demo_base`, conftest.py), a node process with the engine and bwrap sandboxes, the trainer
process, the weight store, evaluation on the 100 held-out tasks before and after (4 sessions per task at
the sampling temperature), the report. Only `trainer.num_steps` is cut (the demo's own figures are in
docs/benchmarks.md).

What "reward goes up" means here: a held-out task's reward is whether its hidden tests pass, and pass@1
over 400 sessions on 100 unseen tasks is a far steadier measure than the per-step reward of the few sampled
groups of one step (their tasks differ from step to step). The assertions are demo_learning.py's.
"""

import pytest
from demo_learning import STEPS, assert_learned

from flywheel.pipeline.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("world_size", [1, 2], ids=["1rank", "2ranks"])
def test_reduced_demo_raises_heldout_pass_rate(demo_base, tmp_path, world_size):
    """world_size 2: the same run with the trainer sharded over two torchrun ranks (FSDP2, gloo)."""
    run_dir = tmp_path / "demo"
    demo_base.seed_summary(run_dir)
    cfg = demo_base.config(run_dir, "--trainer.num_steps", str(STEPS), "--trainer.world_size", str(world_size))
    assert_learned(run_job(cfg, show_progress=False), run_dir)
