"""One OpenMP team at a time: a thread that has finished its torch work gives its worker threads back.

    from flywheel.modeling import openmp
    openmp.release_team()     # True: this thread's OpenMP workers are gone (its next parallel op makes new ones)

Why: every thread that runs a parallel torch op gets its own libgomp team (itself and num_threads - 1 workers),
and the workers stay, asleep, after the op. Once the process holds more OpenMP threads than it has CPUs, libgomp
cuts its spin-wait from ~300,000 polls to 100 for every team (`gomp_throttled_spin_count_var`), so each parallel
region ends with its workers asleep and every op pays a futex wake. The engine's decode thread is such a second
team whenever the thread that loaded the model ran torch ops first. Measured on a 2-core Intel Xeon
(SmolLM2-135M bf16, batch 32): the same `DecoderRunner.decode` took ~94 ms a step on a second thread against
~62 ms on the main thread, and 54.7 ms when that thread was the process's only torch thread (docs/inference.md).
The count of threads is what decides it: `GOMP_SPINCOUNT` did not change the figure, and `OMP_WAIT_POLICY=PASSIVE`
made the main thread as slow as the second.

How: OpenMP 5.0's `omp_pause_resource_all(omp_pause_soft)` frees the calling thread's pool in libgomp and takes
its workers off the count; it touches no other thread's team and returns -1 inside a parallel region. So the
engine calls it in the thread that built it (which loaded the model), in a thread that installed a weight update,
and in its decode thread when that goes idle (inference/local.py); the bench calls it after each HF contender's
run (bench/engine.py). A later parallel op in such a thread makes a new team (one thread start per worker).

Only libgomp (torch's own on Linux) is called: there it is per-thread. LLVM's and Intel's runtimes pause the whole
process, which would stall another thread's parallel region, so where torch uses one of those (or none) this is a
no-op that returns False.

It never adds threads, and it changes nothing for a process of one torch thread (the RL job's processes on CPU,
docs/concepts.md), which has no workers. Where a process runs two teams at once (a trainer thread beside the
engine's) both stay throttled, as they should: there are more threads than CPUs.
"""

from __future__ import annotations

import ctypes
import functools

_OMP_PAUSE_SOFT = 1


@functools.lru_cache(maxsize=1)
def _pause_all():
    """libgomp's `omp_pause_resource_all`, from the copy torch has loaded, or None."""
    import torch  # noqa: F401 - loads torch's libgomp into the process

    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        paths = {line.split()[-1] for line in maps if "/libgomp" in line and line.rstrip().endswith(".so.1")}
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):  # an old libgomp (before GCC 9) has no pause
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


def release_team() -> bool:
    """Free the calling thread's OpenMP worker threads. False where there is nothing to call (not libgomp, no
    OpenMP) or the call refused (inside a parallel region). Safe to call at any time from any thread."""
    try:
        fn = _pause_all()
    except OSError:  # no /proc (not Linux)
        return False
    return fn is not None and fn(_OMP_PAUSE_SOFT) == 0
