"""The demo's learning run with a service in every session: held-out pass@1 rises, no service outlives the run.

Every train and held-out task of the demo's base is given a per-session service that serves its hidden tests
(`tasks/served.py`: kind `command`, started by `CodingEnv.reset` in the session's own network namespace before the
agent's first turn, read by the grader, stopped at `close`), so a session's reward can only come from a live
service. The problem and workspace are the demo's, so the demo's base behaves as on the demo's tasks; pass@1 is
measured before (not taken from the base's build, which had no services) and after, with the services too. The run
and its assertions are test_demo_learns.py's (demo_learning.py); afterwards no served-tests process or data
directory is left on the machine, and this process holds no more network namespaces
than before.

Why not PostgreSQL per session: at 1.7 s per start (docs/environments.md) the ~1,760 sessions of this run would
spend ~49 min starting clusters; the database's own path is tests/unit/test_services.py's (the migration task).

    FLYWHEEL_DEMO_BASE=/path/to/base pytest -q tests/integration/test_services_learns.py   # reuse a built base
"""

import pytest
from demo_learning import STEPS, assert_learned

from flywheel.pipeline.job import run_job
from flywheel.sandbox import netns, services
from flywheel.tasks.loaders import load_tasks, save_tasks
from flywheel.tasks.served import serve_hidden_tests, survivors

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800),
              pytest.mark.skipif(not services.available(), reason="services need root, network namespaces, bwrap")]


def test_demo_learns_with_a_live_service_in_every_session(demo_base, tmp_path):
    files = {}
    for split in ("train", "heldout"):
        tasks = [serve_hidden_tests(t) for t in load_tasks(demo_base.model_dir.parent / "tasks" / f"{split}.jsonl").tasks]
        files[split] = tmp_path / f"{split}-served.jsonl"
        save_tasks(tasks, files[split])
    run_dir = tmp_path / "demo"
    cfg = demo_base.config(run_dir, "--trainer.num_steps", str(STEPS), "--tasks", str(files["train"]),
                           "--eval_tasks", str(files["heldout"]))
    namespaces = netns.held_by_this_process()  # the evaluation's sessions run in this process, RL's in a child
    summary = run_job(cfg, show_progress=False)
    print(f"pass@1 {summary['pass1_before']:.3f} -> {summary['pass1_after']:.3f}; timings {summary['timings_s']}")
    assert_learned(summary, run_dir)
    assert summary["rl"].get("buffer/env_failures", 0) == 0  # a service that failed to start is an env failure
    assert survivors() == [] and netns.held_by_this_process() == namespaces
