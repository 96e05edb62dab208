"""An inference node: one engine, its rollout workers and its weight subscriber.

    node = InferenceNode(spec)           # loads tokenizer, model, tasks; starts the engine
    await node.produce(emit, stop)        # async mode: groups flow out until `stop` is set
    groups = await node.generate(num_groups=4, min_version=3)   # sync mode: exactly these, on-policy

Why a plain class: the local backend runs it in a child process (orchestrator/local.py) and the Ray backend
wraps the very same class as an actor. Weights reach the node only through the weight store: the
subscriber polls the store, verifies every chunk and hot-swaps the engine between decode steps.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flywheel.config import FlywheelConfig
from flywheel.envs.remote_client import env_factory
from flywheel.envs.tools import tools_for
from flywheel.inference.registry import build_node_engine
from flywheel.orchestrator.pacing import Permits, paced
from flywheel.orchestrator.task_sampler import task_sampler
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import load_tokenizer
from flywheel.rollout.worker import RolloutWorker
from flywheel.sandbox.sandbox import num_open
from flywheel.types import Task, Trajectory


@dataclass
class NodeSpec:
    """Everything a node needs, picklable (it crosses a process boundary)."""

    config: dict  # FlywheelConfig.model_dump()
    model_dir: str  # the base model the node starts from (version 0)
    tokenizer_dir: str
    tasks: list[Task]
    store_url: str
    cache_dir: str  # materialised task workspaces
    node_id: int = 0
    seed: int = 0
    num_threads: int = 1
    max_groups_in_flight: int = 4
    region: str = ""  # Ray backend: the region label; store_url is then that region's relay URL
    extra: dict = field(default_factory=dict)


def sandbox_stats(num_start_failures: int, num_open_now: int, num_running: int) -> dict[str, float]:
    """A node's sandbox gauges: start failures (cumulative), sandboxes open now, and leaks: those open beyond what
    the running sessions can hold (each its own and, while it is graded, one more). A lower bound of the leaked
    sandboxes while sessions run, exact between them."""
    return {"sandbox/failures": float(num_start_failures), "sandbox/open": float(num_open_now),
            "sandbox/leaks": float(max(0, num_open_now - 2 * num_running))}


class InferenceNode:
    def __init__(self, spec: NodeSpec, grader=None):
        """`grader` (None: grade in this process) is handed to every CodingEnv (see envs/env.py; the Ray backend
        passes an `orchestrator.grader.GraderPool` over its grader actors)."""
        if spec.num_threads:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.cfg = FlywheelConfig.model_validate(spec.config)
        self.tokenizer = load_tokenizer(spec.tokenizer_dir)
        self.chat = ChatFormat(self.tokenizer, tools_for(self.cfg.env), self.cfg.model.tool_format)
        # store_url: a store directory / fsspec URL, or a relay's http URL (weights.sync.open_source); the engine
        # by inference.type (inference/registry.py), its log (vLLM's server log) beside the node's cache
        self.engine, self.subscriber = build_node_engine(self.cfg, spec.model_dir, self.tokenizer, spec.store_url,
                                                         Path(spec.cache_dir).parent, name=f"vllm-node{spec.node_id}")
        env_cfg, cache_dir, kind = self.cfg.env, Path(spec.cache_dir), self.cfg.env.sandbox
        self.grader = grader
        # local CodingEnv, or sessions on env-servers (env.remote_url; envs/remote_client.py)
        self.worker = RolloutWorker(self.engine, self.chat, env_factory(env_cfg, cache_dir, kind, grader=grader),
                                    self.cfg.rollout)
        self.rng = random.Random(spec.seed * 7919 + spec.node_id)
        self.sampler = task_sampler(spec.tasks, self.rng, self.cfg.orchestrator)
        self.num_groups = 0
        # async pacing (orchestrator/pacing.py): paced, a group starts only with a permit the loop granted
        self.permits = Permits(paced(self.cfg))
        self._granted = asyncio.Event()  # set by allow(): new permits
        self.t_start = time.monotonic()
        self._busy_start = self.engine.busy_s

    async def start(self) -> None:
        """Start the engine's decode loop inside the running event loop."""
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.stop()

    @property
    def version(self) -> int:
        return self.engine.version

    async def _group(self, min_version: int | None = None) -> list[Trajectory]:
        index = self.sampler.next()
        task = self.spec.tasks[index]
        self.num_groups += 1
        gid = f"n{self.spec.node_id}/g{self.num_groups}/{task.id}"
        group = await self.worker.run_group(task, group_id=gid, seed=self.rng.randrange(1 << 30))
        self.sampler.observe_group(index, group)
        return group

    def sync_weights(self) -> int | None:
        """Pull the newest version from the store, if any; returns it (None when already current)."""
        return self.subscriber.poll()

    async def produce(self, emit: Callable[[list[Trajectory]], None], stop: asyncio.Event) -> None:
        """Async mode: keep `max_groups_in_flight` groups running (paced: while permits last, see `allow`);
        emit each as it completes."""
        in_flight: set[asyncio.Task] = set()
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.sync_weights)
            except Exception:  # the subscriber keeps its last good weights; production goes on
                self._report("weight sync failed")
            while len(in_flight) < self.spec.max_groups_in_flight and self.permits.take():
                in_flight.add(asyncio.ensure_future(self._group()))
            self._granted.clear()  # paced: new permits wake the loop too, so a free slot is filled at once
            granted = asyncio.ensure_future(self._granted.wait())
            done, _ = await asyncio.wait({*in_flight, granted}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            granted.cancel()
            done.discard(granted)
            in_flight -= done
            for fut in done:
                try:
                    emit(fut.result())
                except Exception:  # a bug in one group (or in sending it) must not stop the node: count it, say why, go on
                    self.worker.counters["group_errors"] += 1
                    self.permits.give(1)  # the group never reaches the loop: its permit starts another
                    self._report("a rollout group failed")
        for fut in in_flight:
            fut.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)

    def allow(self, num_groups: int) -> None:
        """Paced async mode: the loop grants `num_groups` more group starts (orchestrator/pacing.py)."""
        self.permits.give(num_groups)
        self._granted.set()

    def _report(self, what: str) -> None:
        print(f"flywheel node {self.spec.node_id}: {what}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)

    async def generate(self, num_groups: int, min_version: int, timeout_s: float = 600.0) -> list[list[Trajectory]]:
        """Sync mode: wait until the engine serves `min_version`, then run `num_groups` groups on it."""
        deadline = time.monotonic() + timeout_s
        while self.engine.version < min_version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {min_version} did not reach node {self.spec.node_id}")
            if await asyncio.to_thread(self.sync_weights) is None:
                await asyncio.sleep(0.05)
        return list(await asyncio.gather(*[self._group(min_version) for _ in range(num_groups)]))

    def stats(self) -> dict:
        """Engine busy fraction, weight-sync figures of the last installed version, rollout counters."""
        elapsed = time.monotonic() - self.t_start
        busy = self.engine.busy_s - self._busy_start
        s = {"engine/busy": busy / elapsed if elapsed > 0 else 0.0, "node/version": self.engine.version}
        if self.subscriber.metrics:
            m = self.subscriber.metrics[-1]
            s.update({"weights/pause_ms": m.get("pause_ms", 0.0), "weights/apply_ms": m.get("total_ms", 0.0)})
        s.update({f"rollout/{k}": float(v) for k, v in self.worker.counters.items()})
        s.update(sandbox_stats(self.worker.counters["sandbox_start_failures"], num_open(), self.worker.num_running))
        s.update(self.sampler.stats())
        if hasattr(self.grader, "stats"):
            s.update(self.grader.stats())
        return s
