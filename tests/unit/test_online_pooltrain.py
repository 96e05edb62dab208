"""The pure logic of training the online learner on the pool's groups (online/groups.py, gate.paired_records):
group-relative advantages carried in the reward, the feedback/group step schedule, the inbox's bound, the pairing
of held-out coding results, and the config rule that pool training needs rollouts and the learner."""

import math
import threading

import pytest

from flywheel.config import load_config
from flywheel.online.gate import paired_records
from flywheel.online.groups import GroupInbox, group_samples, next_source
from flywheel.trainer.buffer import Buffer
from flywheel.types import Reward, Segment, Trajectory


def _traj(group: str, reward: float, version: int = 0, flags=()) -> Trajectory:
    seg = Segment([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.7], [-1, -1, version, version])
    return Trajectory("task", group, [seg], Reward(reward, components={"tests": reward}, flags=list(flags)))


def test_group_samples_carry_grpo_and_drgrpo_advantages_and_keep_the_raw_reward():
    group = [_traj("g", 1.0), _traj("g", 0.0), _traj("g", 0.0), _traj("g", 1.0, flags=("runner_tampered",))]
    grpo = group_samples(group, "grpo")
    # mean 0.5, unbiased std sqrt(1/3): (1 - 0.5) / 0.57735 = 0.866
    assert [round(t.graded.value, 4) for t in grpo] == [0.866, -0.866, -0.866, 0.866]
    assert [t.graded.components["reward"] for t in grpo] == [1.0, 0.0, 0.0, 1.0]
    assert grpo[3].graded.flags == ["runner_tampered"] and grpo[0].graded.components["tests"] == 1.0
    assert all(t.meta["source"] == "pool" for t in grpo)
    assert [t.graded.value for t in group] == [1.0, 0.0, 0.0, 1.0]  # the pool's own trajectories are untouched
    dr = group_samples(group, "drgrpo")
    assert [t.graded.value for t in dr] == [0.5, -0.5, -0.5, 0.5]
    two = group_samples([_traj("a", 1.0), _traj("a", 0.0), _traj("b", 0.25), _traj("b", 0.75)], "drgrpo")
    assert [t.graded.value for t in two] == [0.5, -0.5, -0.25, 0.25]  # each group against its own mean
    with pytest.raises(ValueError, match="online.pool.advantage"):
        group_samples(group, "given")


def test_the_schedule_is_work_conserving_and_splits_contested_steps_by_share():
    assert next_source(False, False, {}, 0.5) is None
    assert next_source(True, False, {"groups": 0, "feedback": 99}, 1.0) == "feedback"  # alone: always trains
    assert next_source(False, True, {"groups": 99, "feedback": 0}, 0.0) == "groups"

    def run(share, n):
        counts = {"feedback": 0, "groups": 0}
        order = []
        for _ in range(n):
            s = next_source(True, True, counts, share)
            counts[s] += 1
            order.append(s[0])
        return "".join(order), counts

    assert run(0.5, 6)[0] == "gfgfgf"
    assert run(0.0, 4)[0] == "ffff" and run(1.0, 4)[0] == "gggg"
    order, counts = run(0.25, 40)
    assert counts["groups"] == 10 and "gg" not in order  # a quarter of the steps, spread out
    with pytest.raises(ValueError, match="group_step_share"):
        next_source(True, True, {}, 1.5)


def test_the_inbox_drops_the_oldest_beyond_its_bound_and_counts_them():
    inbox = GroupInbox(max_waiting=3)
    for i in range(5):
        inbox.put([_traj(f"g{i}", 0.0)])
    got = inbox.drain()
    assert [g[0].group_id for g in got] == ["g2", "g3", "g4"]
    assert inbox.num_put == 5 and inbox.num_overflow == 2 and inbox.drain() == []
    # many producers, one consumer: nothing is lost below the bound
    big = GroupInbox(max_waiting=10_000)
    threads = [threading.Thread(target=lambda k=k: [big.put([_traj(f"{k}-{j}", 0.0)]) for j in range(500)])
               for k in range(4)]
    for t in threads:
        t.start()
    drained = []
    while any(t.is_alive() for t in threads):
        drained += big.drain()
    for t in threads:
        t.join()
    drained += big.drain()
    assert len(drained) == 2000 and big.num_overflow == 0
    with pytest.raises(ValueError, match="max_waiting_groups"):
        GroupInbox(0)


def test_the_buffer_drops_groups_too_many_deployed_versions_behind_the_learner():
    buf = Buffer(max_staleness=1, drop_uniform_groups=True)
    assert buf.admit([_traj("old", 1.0, version=3), _traj("old", 0.0, version=3)], trainer_version=5) == "stale"
    assert buf.admit([_traj("u", 1.0, version=5), _traj("u", 1.0, version=5)], trainer_version=5) == "uniform"
    assert buf.admit([_traj("ok", 1.0, version=4), _traj("ok", 0.0, version=5)], trainer_version=5) == "admitted"
    assert buf.take(2, trainer_version=6) is None  # it aged past the bound while waiting (6 - 4 > 1)
    assert buf.counters["dropped_stale"] == 4 and buf.counters["dropped_uniform"] == 2


def test_coding_results_are_paired_by_task_and_tasks_either_version_could_not_score_are_left_out():
    serving = [{"task_id": "a", "n": 2, "correct": 1, "flags": []}, {"task_id": "b", "n": 2, "correct": 0},
               {"task_id": "c", "n": 0, "correct": 0}, {"task_id": "d", "n": 2, "correct": 2}]
    candidate = [{"task_id": "d", "n": 1, "correct": 0, "flags": ["runner_tampered"]},
                 {"task_id": "b", "n": 0, "correct": 0}, {"task_id": "a", "n": 2, "correct": 2},
                 {"task_id": "c", "n": 2, "correct": 2}]
    s, c = paired_records(serving, candidate)
    assert [r.score for r in s] == [0.5, 1.0] and [r.score for r in c] == [1.0, 0.0]
    assert c[1].flags == ["runner_tampered"] and s[1].flags == []
    assert paired_records(serving, []) == ([], [])
    assert not any(math.isnan(r.score) for r in s + c)


def test_pool_training_without_rollouts_or_without_the_learner_is_refused_naming_the_settings():
    with pytest.raises(ValueError, match=r"online.pool.train = true .* online.pool.rollouts = true"):
        load_config(None, ["--online.pool.train=true"])
    with pytest.raises(ValueError, match=r"online.learner.enabled = true"):
        load_config(None, ["--online.pool.train=true", "--online.pool.rollouts=true",
                           "--online.learner.enabled=false"])
    cfg = load_config(None, ["--online.pool.train=true", "--online.pool.rollouts=true"])
    assert cfg.online.pool.train and cfg.online.pool.advantage == "grpo"
