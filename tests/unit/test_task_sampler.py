"""The task sampler: uniform without buckets, and draws shifted towards buckets whose groups had mixed rewards."""

import random
from collections import Counter

import pytest

from flywheel.orchestrator.task_sampler import TaskSampler
from flywheel.types import Task


def tasks(kinds: dict[str, int]) -> list[Task]:
    out = []
    for kind, n in kinds.items():
        out += [Task(id=f"{kind}-{i}", problem="p", files={}, meta={"kind": kind}) for i in range(n)]
    return out


def test_without_buckets_draws_like_uniform_choice():
    ts = tasks({"a": 5, "b": 7})
    sampler = TaskSampler(ts, random.Random(3))
    reference = random.Random(3)
    assert [sampler.next() for _ in range(50)] == [reference.randrange(len(ts)) for _ in range(50)]
    assert sampler.stats() == {}


def test_shares_follow_bucket_size_until_observed_then_the_mixed_rate():
    sampler = TaskSampler(tasks({"a": 10, "b": 30}), random.Random(0), bucket_key="kind", window=4, floor=0.2)
    assert sampler.shares() == pytest.approx({"a": 0.25, "b": 0.75})  # equal (unseen) rates: uniform over tasks
    for _ in range(4):
        sampler.observe(0, [0.0, 1.0])   # bucket a: mixed every time -> rate 5/6
        sampler.observe(10, [0.0, 0.0])  # bucket b: uniform every time -> rate 1/6
    assert sampler.rate("a") == pytest.approx(5 / 6) and sampler.rate("b") == pytest.approx(1 / 6)
    wa, wb = 10 * 5 / 6, 30 * 1 / 6
    expected_a = 0.2 * 0.25 + 0.8 * wa / (wa + wb)
    assert sampler.shares()["a"] == pytest.approx(expected_a)
    assert sampler.stats()["tasks/share/a"] == pytest.approx(expected_a)
    drawn = Counter(sampler.bucket_of[sampler.next()] for _ in range(4000))
    assert drawn["a"] / 4000 == pytest.approx(expected_a, abs=0.03)


def test_window_forgets_old_groups_so_a_bucket_that_becomes_learnable_recovers():
    sampler = TaskSampler(tasks({"a": 1, "b": 1}), random.Random(0), bucket_key="kind", window=3, floor=0.0)
    for _ in range(3):
        sampler.observe(0, [0.0] * 4)
    assert sampler.rate("a") == pytest.approx(1 / 5)
    for _ in range(3):
        sampler.observe(0, [1.0, 0.0, 0.0, 0.0])
    assert sampler.rate("a") == pytest.approx(4 / 5)


def test_floor_keeps_every_bucket_drawn_and_bad_settings_are_refused():
    sampler = TaskSampler(tasks({"a": 1, "b": 1}), random.Random(0), bucket_key="kind", window=1000, floor=0.1)
    for _ in range(1000):
        sampler.observe(0, [0.0, 0.0])
        sampler.observe(1, [0.0, 1.0])
    assert sampler.shares()["a"] >= 0.05
    with pytest.raises(ValueError, match="window"):
        TaskSampler(tasks({"a": 1}), random.Random(0), window=0)
    with pytest.raises(ValueError, match="at least one task"):
        TaskSampler([], random.Random(0))
    with pytest.raises(ValueError, match="'kimd' is not a meta field of any task; the tasks have \\['kind'\\]"):
        TaskSampler(tasks({"a": 1}), random.Random(0), bucket_key="kimd")  # a typo must not fall back to uniform


def test_observe_group_reads_the_rewards_of_trajectories():
    from flywheel.types import Reward, Trajectory

    def group(*values):
        return [Trajectory(task_id="t", group_id="g", reward=Reward(value=v)) for v in values]

    sampler = TaskSampler(tasks({"a": 1, "b": 1}), random.Random(0), bucket_key="kind", window=4)
    sampler.observe_group(0, group(0.0, 1.0))
    sampler.observe_group(1, group(1.0, 1.0))
    assert list(sampler.recent["a"]) == [True] and list(sampler.recent["b"]) == [False]
