"""The plain classes the Ray backend runs as actors: an inference engine with its workers, a grader, a weight relay.

    EngineActor(spec, graders=[h, ...])   # InferenceNode(spec) inside an asyncio actor; run_group(...) is the unit
                                          # of work; with grader handles its sessions are graded by GraderActors
    GraderActor(env_config, cache_dir)    # grade(task, changes, tool_log) -> Reward: rebuild + reward.grade
    RelayActor(store=...) | RelayActor(upstream=url)   # weights.relay.RelayServer on the actor's node

Why so: these are plain classes (no Ray import here); orchestrator/ray.py applies `ray.remote` to them in one
place (`as_actor`). The driver, not the engine, picks each group's task and seed, so a group whose engine dies
can be run again, identically, on another engine (re-queued). The engine keeps pulling the newest weights from
its region's relay in the background, exactly as a local node does, and stamps every token with its version.
"""

from __future__ import annotations

import asyncio
import os
import threading

from flywheel.config import EnvConfig, FlywheelConfig
from flywheel.envs.changes import RebuildGrader
from flywheel.orchestrator.grader import GraderPool
from flywheel.orchestrator.node import InferenceNode, NodeSpec
from flywheel.types import Reward, Task, Trajectory
from flywheel.weights.relay import RelayServer


class EngineActor:
    """One InferenceNode (engine + rollout workers + subscriber); many `run_group` calls run concurrently."""

    def __init__(self, spec: NodeSpec, poll_interval_s: float = 0.5, graders: list | None = None):
        grader = None
        if graders:  # sessions are graded by grader actors; in-process only when none of them is left

            env = FlywheelConfig.model_validate(spec.config).env
            grader = GraderPool(graders, RebuildGrader(env, spec.cache_dir, env.sandbox),
                                timeout_s=2 * env.grade_timeout_s + 60)
        self.node = InferenceNode(spec, grader=grader)
        self.poll_interval_s = poll_interval_s
        self._sync_task: asyncio.Task | None = None
        self._started: asyncio.Future | None = None
        self._num_running = 0

    async def ready(self) -> int:
        """Start the engine, pull the newest anchor and deltas from the store; returns the version served.
        Idempotent: concurrent and later calls wait for the one start."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)
        return self.node.version

    async def _start(self) -> None:
        await self.node.start()
        await asyncio.to_thread(self.node.sync_weights)
        self._sync_task = asyncio.ensure_future(self._sync_loop())

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.to_thread(self.node.sync_weights)
            await asyncio.sleep(self.poll_interval_s)

    async def run_group(self, task_index: int, seed: int, group_id: str, min_version: int) -> tuple[list[Trajectory], dict]:
        """Run the G sessions of task `task_index` (at weights `min_version` or newer); returns (group, stats)."""
        if not 0 <= task_index < len(self.node.spec.tasks):
            raise ValueError(f"task index {task_index} out of range (engine holds {len(self.node.spec.tasks)} tasks)")
        while self.node.version < min_version:
            if await asyncio.to_thread(self.node.sync_weights) is None:
                await asyncio.sleep(0.05)
        self._num_running += 1
        try:
            group = await self.node.worker.run_group(self.node.spec.tasks[task_index], group_id=group_id, seed=seed)
        finally:
            self._num_running -= 1
        self.node.num_groups += 1
        return group, self.stats()

    def stats(self) -> dict:
        return {**self.node.stats(), "node/region": self.node.spec.region, "node/running_groups": self._num_running}

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        await self.node.close()


class GraderActor:
    """Runs the hidden tests of sessions that ran elsewhere: task base + the agent's changes, then `reward.grade`.

    A threaded actor (`ray.grader_concurrency` gradings at once): grading is subprocess work in a sandbox."""

    def __init__(self, env_config: dict, cache_dir: str):
        env = EnvConfig.model_validate(env_config)
        self.grader = RebuildGrader(env, cache_dir, env.sandbox)
        self._lock = threading.Lock()
        self.num_graded = 0

    def grade(self, task: Task, changes, tool_log: list[dict]) -> Reward:
        reward = self.grader.grade(task, changes, tool_log)
        with self._lock:
            self.num_graded += 1
        return reward

    def stats(self) -> dict:
        return {"num_graded": self.num_graded, "pid": os.getpid()}


class RelayActor:
    """A RelayServer (weights/relay.py) serving a store (origin) or relaying an upstream URL (a region)."""

    def __init__(self, *, store: str | None = None, upstream: str | None = None, host: str = "auto",
                 bandwidth_mbps: float = 0.0, streams: int = 8):
        if host == "auto":  # bind where the engines of other nodes can reach it
            import ray

            host = ray.util.get_node_ip_address()
        self.server = RelayServer(store=store, upstream=upstream, host=host, port=0,
                                  bandwidth_mbps=bandwidth_mbps, streams=streams)
        self._url = self.server.start()

    def url(self) -> str:
        return self._url

    def stats(self) -> dict:
        return dict(self.server.stats)

    def close(self) -> None:
        self.server.stop()
