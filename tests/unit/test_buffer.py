"""Ordering and bookkeeping of the staleness buffer, with hand-made trajectories."""

from flywheel.trainer.buffer import Buffer, group_staleness
from flywheel.types import Reward, Segment, Trajectory


def traj(version: int, reward: float, gid: str = "g", failure: str | None = None) -> Trajectory:
    seg = Segment(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0], versions=[-1, version, version + 1])
    return Trajectory(task_id="t", group_id=gid, segments=[seg], reward=None if failure else Reward(reward),
                      env_failure=failure)


def test_staleness_is_trainer_minus_oldest_token():
    assert group_staleness([traj(3, 1.0), traj(5, 0.0)], trainer_version=7) == 4


def test_admit_drops_stale_uniform_and_failed():
    buf = Buffer(max_staleness=2)
    assert buf.admit([traj(1, 1.0), traj(1, 0.0)], trainer_version=4) == "stale"
    assert buf.admit([traj(4, 1.0), traj(4, 1.0)], trainer_version=4) == "uniform"
    assert buf.admit([traj(4, 1.0, failure="sandbox died")], trainer_version=4) == "env_failure"
    assert buf.admit([traj(4, 1.0), traj(4, 0.0), traj(4, 0.0, failure="x")], trainer_version=4) == "admitted"
    assert len(buf) == 2
    assert buf.counters["dropped_stale"] == 2 and buf.counters["dropped_uniform"] == 2
    assert buf.counters["env_failures"] == 2


def test_take_returns_whole_groups_and_ages_out_stale_ones():
    buf = Buffer(max_staleness=1)
    buf.admit([traj(0, 1.0, "a"), traj(0, 0.0, "a")], trainer_version=0)
    buf.admit([traj(2, 1.0, "b"), traj(2, 0.0, "b")], trainer_version=2)
    buf.admit([traj(2, 1.0, "c"), traj(2, 0.0, "c")], trainer_version=2)
    assert buf.take(6, trainer_version=2) is None  # group a aged out: only 4 left
    assert buf.counters["dropped_stale"] == 2
    batch = buf.take(3, trainer_version=2)
    assert [t.group_id for t in batch] == ["b", "b", "c", "c"]
    assert len(buf) == 0 and buf.staleness_hist == {0: 2}


def test_waiting_keys_survive_take_and_restore():
    buf = Buffer(max_staleness=4)
    for key in range(3):
        buf.admit([traj(0, 1.0, str(key)), traj(0, 0.0, str(key))], trainer_version=0, key=key)
    buf.take(2, trainer_version=0)
    assert buf.waiting_keys() == [1, 2]
    again = Buffer(max_staleness=4)
    again.restore([(k, [traj(0, 1.0), traj(0, 0.0)]) for k in buf.waiting_keys()])
    assert again.waiting_keys() == [1, 2] and len(again) == 4 and again.counters["admitted"] == 0
