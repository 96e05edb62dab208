"""Pin this process to one core and every process it starts to another, for `flywheel bench pipeline`.

    with pinned(trainer_cpu=0, rollout_cpu=1):
        run_rl(...)        # trainer threads on core 0; inference nodes, their engines and sandboxes on core 1

Why: on two shared cores the asynchronous loop can only reclaim idle time, because the trainer and the engine
compete for the same cores. Pinned, each side owns a core, which is the analogue on one machine of a trainer
and an inference engine on separate devices (the setting where asynchronous RL pays off in production).

How: Linux CPU affinity (`os.sched_setaffinity`, what `taskset` sets) is per thread and is inherited by new
threads and processes. A watcher thread sets it every `interval_s` for every thread of this process and for
every thread of every descendant process (found through /proc), so processes started meanwhile (inference
nodes start with the affinity of the thread that spawned them) move to their core within one interval; the
sandboxes a node starts inherit the node's core. The affinity of this process is restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # the process has exited
        return []


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` in the process tree (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _set(tids: list[int], cpus: set[int]) -> None:
    for tid in tids:
        with contextlib.suppress(OSError):  # exited meanwhile, or not ours to move
            os.sched_setaffinity(tid, cpus)


def pin_once(trainer_cpus: set[int], rollout_cpus: set[int]) -> None:
    me = os.getpid()
    _set(_threads(me), trainer_cpus)
    for pid in descendants(me):
        _set(_threads(pid), rollout_cpus)


@contextlib.contextmanager
def pinned(trainer_cpu: int = 0, rollout_cpu: int = 1, interval_s: float = 0.2) -> Iterator[None]:
    """This process's threads on `trainer_cpu`, every descendant's on `rollout_cpu`, until the block ends."""
    available = os.sched_getaffinity(0)
    if {trainer_cpu, rollout_cpu} - available or trainer_cpu == rollout_cpu:
        raise ValueError(f"pinning needs two distinct cores among the {sorted(available)} this process may use; "
                         f"got trainer {trainer_cpu}, rollouts {rollout_cpu}")
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pin_once({trainer_cpu}, {rollout_cpu})
            stop.wait(interval_s)

    pin_once({trainer_cpu}, {rollout_cpu})
    watcher = threading.Thread(target=watch, name="flywheel-pin", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        _set(_threads(os.getpid()), available)
