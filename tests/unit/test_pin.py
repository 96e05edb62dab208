"""bench/_pin.py: the trainer's threads on one core, every process it starts (and theirs) on the other."""

import os
import subprocess
import sys
import time

import pytest

from flywheel.bench._pin import descendants, pinned

TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not TWO_CORES, reason="pinning needs two cores this process may use")
def test_children_and_grandchildren_move_to_the_rollout_core_and_this_process_is_restored():
    before = os.sched_getaffinity(0)
    cpus = sorted(before)[:2]
    grandchild = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(5)'])"
    with pinned(trainer_cpu=cpus[0], rollout_cpu=cpus[1], interval_s=0.05):
        assert os.sched_getaffinity(0) == {cpus[0]}
        child = subprocess.Popen([sys.executable, "-c", grandchild])
        try:
            # only this test's child and grandchild: the suite may run other children of this process meanwhile
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not descendants(child.pid):
                time.sleep(0.05)
            time.sleep(0.2)  # a few watcher rounds
            tree = [child.pid, *descendants(child.pid)]
            assert len(tree) == 2 and all(os.sched_getaffinity(pid) == {cpus[1]} for pid in tree)
        finally:
            for pid in descendants(child.pid):  # the grandchild first: it would outlive its parent
                os.kill(pid, 9)
            child.kill()
            child.wait()
    assert os.sched_getaffinity(0) == before


def test_the_same_core_twice_is_refused():
    with pytest.raises(ValueError, match="two distinct cores"):
        with pinned(trainer_cpu=0, rollout_cpu=0):
            pass
