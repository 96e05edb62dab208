"""One OpenMP team at a time (modeling/openmp.py): a thread's workers go when it releases its team, and an idle
engine and the thread that built it hold none, so that the decode thread's team is the only one while it decodes.

Each case runs in a child process: the count of a process's threads is the evidence, and this test process has
teams of its own. The speed this buys is measured by `flywheel bench engine`, not asserted here."""

import json
import subprocess
import sys
import textwrap

import pytest

from flywheel.modeling import openmp

needs_libgomp = pytest.mark.skipif(openmp._pause_all() is None,
                                   reason="torch here does not use libgomp (nothing per-thread to release)")

_COUNT = """
    import json, os, threading, time
    import torch
    from flywheel.modeling import openmp
    torch.set_num_threads(2)  # a team of two whatever the CPUs: one worker thread besides the caller

    def threads(expect=None):
        # a released worker leaves the process a moment after the pause returns
        for _ in range(200):
            n = len(os.listdir("/proc/self/task"))
            if expect is None or n == expect:
                return n
            time.sleep(0.01)
        return n

    def parallel_op():
        torch.ones(1 << 22).mul_(2.0)  # 4M elements: above torch's grain size, so it runs in a parallel region
"""


def _child(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_COUNT) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_libgomp
def test_release_team_takes_the_calling_threads_workers_away_and_a_later_op_makes_new_ones():
    out = _child("""
        base = threads()
        parallel_op()
        with_team = threads()
        released = openmp.release_team()
        after = threads(base)
        parallel_op()
        again = threads()
        print(json.dumps(dict(base=base, with_team=with_team, released=released, after=after, again=again)))
    """)
    assert out["with_team"] == out["base"] + 1
    assert out["released"] is True
    assert out["after"] == out["base"]
    assert out["again"] == out["base"] + 1


@needs_libgomp
def test_release_touches_only_the_calling_threads_team():
    out = _child("""
        base = threads()
        go, done = threading.Event(), threading.Event()
        def other():
            parallel_op()
            go.set()
            done.wait()
        t = threading.Thread(target=other)
        t.start()
        go.wait()
        parallel_op()
        two_teams = threads()
        openmp.release_team()  # the main thread's team only
        one_team = threads(two_teams - 1)
        done.set()
        t.join()
        print(json.dumps(dict(base=base, two_teams=two_teams, one_team=one_team)))
    """)
    assert out["two_teams"] == out["base"] + 3  # the other thread, its worker, the main thread's worker
    assert out["one_team"] == out["two_teams"] - 1


@needs_libgomp
def test_an_idle_engine_and_the_thread_that_built_it_hold_no_workers():
    out = _child("""
        import asyncio
        from flywheel.config import ModelConfig
        from flywheel.inference.local import LocalEngine
        from flywheel.policy.model import build_model
        from flywheel.types import SamplingParams
        base = threads()
        model = build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=2048)
        parallel_op()  # the main thread has a team, as after loading a real model
        with_team = threads()
        weights = {n: p.detach().clone() for n, p in model.state_dict().items()}

        async def main():
            async with LocalEngine(model, max_batch_size=8) as engine:
                built = threads(base + 1)  # the decode thread, no worker of the main thread's
                gens = await asyncio.gather(*(engine.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=8))
                                              for _ in range(4)))
                assert all(len(g.token_ids) == 8 for g in gens)
                idle = threads(base + 1)
                await asyncio.to_thread(engine.update_weights, 1, weights)  # copies on a pool thread
                swapped = threads(base + 2)  # the decode thread and the pool's thread, no worker
            return built, idle, swapped

        built, idle, swapped = asyncio.run(main())
        print(json.dumps(dict(base=base, with_team=with_team, built=built, idle=idle, swapped=swapped)))
    """)
    assert out["with_team"] == out["base"] + 1
    assert out["built"] == out["base"] + 1
    assert out["idle"] == out["base"] + 1
    assert out["swapped"] == out["base"] + 2

