"""The loop's per-step figures of every group received (orchestrator/loop.py), with hand-made trajectories."""

from flywheel.orchestrator.loop import hidden_tests_ran, node_metrics, received_metrics
from flywheel.orchestrator.node import sandbox_stats
from flywheel.types import Reward, Trajectory


def traj(value: float, submitted: bool, **components: float) -> Trajectory:
    return Trajectory(task_id="t", group_id="g", reward=Reward(value, components={"tests": value, **components}),
                      meta={"submitted": submitted})


def test_sandbox_test_runs_and_submissions_are_counted_per_session():
    ran, cached, skipped = traj(1.0, True), traj(1.0, True, tests_cached=1.0), traj(0.0, False, tests_not_run=1.0)
    assert [hidden_tests_ran(t) for t in (ran, cached, skipped)] == [True, False, False]
    m = received_metrics([[ran, cached], [skipped, traj(0.0, True)]])
    assert m["rollout/num_all"] == 4.0
    assert m["rollout/test_runs"] == 0.5  # `ran` and the last one
    assert m["rollout/submitted"] == 0.75
    assert m["rollout/reward_all"] == 0.5
    assert received_metrics([]) == {}
    summarized = traj(1.0, True)
    summarized.meta.update(num_summaries=2, context_full=True)
    m = received_metrics([[summarized, traj(0.0, True)]])  # the self-summarization figures (rollout/summary_metrics.py)
    assert m["summary/summaries_per_session"] == 1.0 and m["summary/finish_after_summary_rate"] == 0.5
    assert m["summary/context_full_rate"] == 0.5


def test_sessions_that_failed_outside_the_policy_are_left_out():
    """An env failure has no reward (rollout/worker.py): counted by the buffer, not in these means."""
    failed = Trajectory(task_id="t", group_id="g", env_failure="sandbox died")
    assert not hidden_tests_ran(failed)
    m = received_metrics([[traj(1.0, True), failed]])
    assert m["rollout/num_all"] == 1.0 and m["rollout/reward_all"] == 1.0 and m["rollout/test_runs"] == 1.0
    assert received_metrics([[failed]]) == {}


def test_sandbox_startup_percentiles_and_node_counts():
    """Start-up p50 and max over the sessions received since the last step; node sandbox counts are summed over
    nodes (other node figures averaged); leaks are sandboxes open beyond what running sessions can hold."""
    trajs = [traj(1.0, True) for _ in range(3)]
    for t, s in zip(trajs, (0.020, 0.010, 0.300)):
        t.timings["sandbox_start_s"] = s
    failed = Trajectory(task_id="t", group_id="g", env_failure="reset failed")
    m = received_metrics([trajs[:2], [trajs[2], failed]])
    assert m["sandbox/startup_ms_p50"] == 20.0 and m["sandbox/startup_ms_max"] == 300.0
    assert received_metrics([[failed]]) == {}
    assert sandbox_stats(2, 5, 1) == {"sandbox/failures": 2.0, "sandbox/open": 5.0, "sandbox/leaks": 3.0}
    assert sandbox_stats(0, 2, 1)["sandbox/leaks"] == 0.0  # a running session being graded holds two
    nodes = {0: {**sandbox_stats(1, 3, 0), "engine/busy": 0.5}, 1: {**sandbox_stats(2, 0, 0), "engine/busy": 0.7}}
    agg = node_metrics(nodes)
    assert agg["sandbox/failures"] == 3.0 and agg["sandbox/leaks"] == 3.0 and agg["engine/busy"] == 0.6
