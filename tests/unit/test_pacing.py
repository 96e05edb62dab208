"""Async pacing (orchestrator/pacing.py): the bound on groups started ahead of the trainer, and that a paced
pipeline can never stall. The pipeline is simulated here (a fake engine, the real Buffer); the real loop runs
paced in tests/integration/test_rl_loop.py."""

import random

import pytest

from flywheel.config import load_config
from flywheel.orchestrator.local import LocalRollouts
from flywheel.orchestrator.node import NodeSpec
from flywheel.orchestrator.pacing import Permits, ahead_limit, paced, to_grant
from flywheel.trainer.buffer import Buffer
from flywheel.types import Reward, Segment, Trajectory


def cfg(*overrides: str):
    return load_config(None, ["--rollout.group_size", "8", "--trainer.batch_size", "32", *overrides])


def test_the_limit_is_the_groups_in_flight_plus_whole_batches():
    one = cfg("--orchestrator.max_ahead_batches", "1")
    assert paced(one) and ahead_limit(one, num_engines=1, max_groups_in_flight=4) == 4 + 4
    assert ahead_limit(cfg("--orchestrator.max_ahead_batches", "2"), 3, 4) == 12 + 8
    assert ahead_limit(cfg("--orchestrator.max_ahead_batches", "1", "--trainer.batch_size", "20"), 1, 1) == 1 + 3
    assert ahead_limit(one, num_engines=0, max_groups_in_flight=4) == 8  # a pool between engines still forms a batch
    assert not paced(cfg())  # the default: production never pauses
    assert not paced(cfg("--orchestrator.max_ahead_batches", "1", "--orchestrator.mode", "sync"))


def test_grants_fill_up_to_the_limit_and_count_waiting_groups():
    assert to_grant(8, granted=0, received=0, waiting=0) == 8
    assert to_grant(8, granted=8, received=3, waiting=3) == 0  # 5 running, 3 waiting
    assert to_grant(8, granted=8, received=7, waiting=3) == 4  # 4 retired (trained or dropped)
    assert to_grant(8, granted=0, received=0, waiting=10) == 0  # restored from a checkpoint: over the limit


def test_permits_only_bind_when_paced():
    free = Permits(paced=False)
    assert all(free.take() for _ in range(100))
    paced = Permits(paced=True)
    assert not paced.take()
    paced.give(2)
    assert paced.take() and paced.take() and not paced.take()


def _group(version: int, rng: random.Random, gid: str) -> list[Trajectory]:
    seg = Segment(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, version])
    rewards = [float(rng.random() < 0.3) for _ in range(4)]
    return [Trajectory(task_id="t", group_id=gid, segments=[seg], reward=Reward(r)) for r in rewards]


@pytest.mark.parametrize("seed", range(5))
def test_a_paced_pipeline_stays_within_the_limit_and_never_stalls(seed):
    """Events in random order: the engine finishes one of its running groups, or the trainer takes a batch.
    Uniform groups (about half) are dropped. The unretired groups never pass the limit, and every step
    finds its batch."""
    rng = random.Random(seed)
    in_flight, groups_per_batch, limit = 3, 2, 3 + 2
    buffer, permits = Buffer(max_staleness=2), Permits(paced=True)
    running: list[list[Trajectory]] = []
    version = granted = received = 0
    for _ in range(4000):
        n = to_grant(limit, granted, received, buffer.num_groups)
        permits.give(n)
        granted += n
        while len(running) < in_flight and permits.take():
            running.append(_group(version, rng, f"g{granted}"))
        assert granted - received + buffer.num_groups <= limit
        if running and rng.random() < 0.7:
            buffer.admit(running.pop(rng.randrange(len(running))), version)
            received += 1
        elif buffer.take(groups_per_batch * 4, version) is not None:
            version += 1
        if version == 100:
            break
    assert version == 100


def test_local_allow_gives_each_start_to_the_node_with_the_fewest_outstanding():
    specs = [NodeSpec(config={}, model_dir="", tokenizer_dir="", tasks=[], store_url="", cache_dir="", node_id=n)
             for n in range(2)]
    source = LocalRollouts(specs, mode="async")  # processes made, not started: only the control queues are used
    source.allow(3)  # 2 to node 0, 1 to node 1
    source.out_q.put(("group", 1, [], {}))  # node 1 delivers its group
    assert source.get(timeout_s=5)[0] == "group"
    source.allow(2)  # both to node 1, which has none outstanding
    assert source.ctrl_qs[0].get(timeout=5) == ("allow", 2)
    assert [source.ctrl_qs[1].get(timeout=5) for _ in range(2)] == [("allow", 1), ("allow", 2)]
    assert source.ctrl_qs[0].empty()
