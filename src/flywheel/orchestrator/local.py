"""Local backend: each inference node in its own child process, talking to the trainer over queues.

    source = LocalRollouts([spec], mode="async"); source.start()
    msg = source.get(timeout_s=1.0)      # ("group", node_id, [Trajectory, ...], stats) or None
    source.request(num_groups=4, min_version=3)   # sync mode only
    source.allow(num_groups=2)                    # paced async mode: more group starts (orchestrator/pacing.py)
    source.stop()

Why processes: torch forward and backward hold the GIL for long stretches; the trainer and the engine in
one process would take turns instead of running together. Weights do not travel over these queues —
only trajectories, requests and stats do; weights go through the weight store, as on a cluster.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import threading
import time
import traceback
from typing import Any

from flywheel.orchestrator.node import InferenceNode, NodeSpec


def _node_main(spec: NodeSpec, mode: str, out_q: mp.Queue, ctrl_q: mp.Queue) -> None:
    """Child process: build the node, then produce (async) or serve requests (sync) until told to stop."""
    try:
        node = InferenceNode(spec)
        out_q.put(("ready", spec.node_id, node.version, {}))
        asyncio.run(_serve(node, mode, out_q, ctrl_q))
    except Exception:
        out_q.put(("error", spec.node_id, traceback.format_exc(), {}))


async def _serve(node, mode: str, out_q: mp.Queue, ctrl_q: mp.Queue) -> None:
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    requests: asyncio.Queue = asyncio.Queue()

    def read_ctrl() -> None:  # a thread: blocking queue reads must not stall the event loop
        while True:
            msg = ctrl_q.get()
            loop.call_soon_threadsafe(requests.put_nowait, msg)
            if msg[0] == "stop":
                return

    threading.Thread(target=read_ctrl, daemon=True).start()

    def emit(group) -> None:
        out_q.put(("group", node.spec.node_id, group, node.stats()))

    producer = asyncio.ensure_future(node.produce(emit, stop)) if mode == "async" else None

    def producer_done(task: asyncio.Task) -> None:  # it ends only when told to; otherwise the trainer must hear
        if not stop.is_set():
            exc = None if task.cancelled() else task.exception()
            what = "".join(traceback.format_exception(exc)) if exc else "the rollout producer stopped"
            out_q.put(("error", node.spec.node_id, what, {}))

    if producer is not None:
        producer.add_done_callback(producer_done)
    while True:
        msg = await requests.get()
        if msg[0] == "stop":
            break
        if msg[0] == "allow":
            node.allow(msg[1])
        if msg[0] == "generate":
            _, num_groups, min_version = msg
            for group in await node.generate(num_groups, min_version):
                emit(group)
    stop.set()
    if producer is not None:  # a producer that died was reported when it did (producer_done)
        await asyncio.gather(producer, return_exceptions=True)
    await node.close()
    out_q.put(("stopped", node.spec.node_id, node.version, node.stats()))


class LocalRollouts:
    """The trainer's handle on its inference nodes (child processes)."""

    def __init__(self, specs: list[NodeSpec], mode: str = "async"):
        self.specs = specs
        self.mode = mode
        ctx = mp.get_context("spawn")  # fork after torch threads exist is unsafe
        self.out_q: mp.Queue = ctx.Queue()
        self.ctrl_qs = [ctx.Queue() for _ in specs]
        self.procs = [ctx.Process(target=_node_main, args=(s, mode, self.out_q, q), daemon=True, name=f"flywheel-node{s.node_id}")
                      for s, q in zip(specs, self.ctrl_qs)]
        self._next = 0
        self._outstanding = {s.node_id: 0 for s in specs}  # paced: permits granted to a node minus groups it delivered

    def start(self, timeout_s: float = 300.0) -> None:
        for p in self.procs:
            p.start()
        ready = 0
        deadline = time.monotonic() + timeout_s
        while ready < len(self.procs):
            msg = self.get(1.0)  # short waits: a node that dies while starting is noticed at once
            if msg is None and time.monotonic() > deadline:
                raise TimeoutError(f"inference nodes did not start within {timeout_s:g} s (each loads the model "
                                   "and warms up); on a busy machine raise orchestrator.start_timeout_s")
            if msg is not None and msg[0] == "ready":
                ready += 1

    def get(self, timeout_s: float) -> tuple[str, int, Any, dict] | None:
        try:
            msg = self.out_q.get(timeout=timeout_s)
        except queue.Empty:
            dead = [p.name for p in self.procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"inference node process(es) died: {dead}") from None
            return None
        if msg[0] == "error":
            raise RuntimeError(f"inference node {msg[1]} failed:\n{msg[2]}")
        if msg[0] == "group" and self.mode == "async":
            self._outstanding[msg[1]] -= 1
        return msg

    @property
    def num_engines(self) -> int:
        return len(self.specs)

    def allow(self, num_groups: int) -> None:
        """Paced async mode: `num_groups` more group starts, each to the node with the fewest outstanding."""
        per = dict.fromkeys(self._outstanding, 0)
        for _ in range(num_groups):
            per[min(per, key=lambda n: self._outstanding[n] + per[n])] += 1
        for spec, q in zip(self.specs, self.ctrl_qs):
            if per[spec.node_id]:
                self._outstanding[spec.node_id] += per[spec.node_id]
                q.put(("allow", per[spec.node_id]))

    def request(self, num_groups: int, min_version: int) -> None:
        """Sync mode: ask the nodes, round-robin, for `num_groups` groups at `min_version` or newer."""
        per = [0] * len(self.specs)
        for _ in range(num_groups):
            per[self._next % len(per)] += 1
            self._next += 1
        for q, n in zip(self.ctrl_qs, per):
            if n:
                q.put(("generate", n, min_version))

    def pool_stats(self) -> dict:
        """A fixed set of child processes has no pool-wide counters (the nodes report their own)."""
        return {}

    def _running_nodes(self) -> set[int]:
        return {s.node_id for s, p in zip(self.specs, self.procs) if p.is_alive()}

    def stop(self, timeout_s: float = 60.0) -> dict:
        stats: dict = {}
        for q in self.ctrl_qs:
            q.put(("stop",))
        # wait for the running nodes' last stats; one that died (or never started) sends none
        alive = self._running_nodes()
        deadline = time.monotonic() + timeout_s
        while alive and time.monotonic() < deadline:
            try:
                msg = self.out_q.get(timeout=1.0)
            except queue.Empty:
                alive &= self._running_nodes()
                continue
            if msg[0] in ("stopped", "error"):
                alive.discard(msg[1])
                if msg[0] == "stopped":
                    stats.update(msg[3])
        for p in self.procs:
            if p.pid is None:  # never started
                continue
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        return stats
