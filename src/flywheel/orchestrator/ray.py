"""Ray backend, rollout side: an elastic, fault-tolerant pool of engine actors with per-region weight relays.

    source = RayRollouts(specs, cfg); source.start()       # same interface as orchestrator/local.LocalRollouts
    msg = source.get(timeout_s=1.0)                          # ("group", node_id, [Trajectory, ...], stats) or None
    node_id = source.add_engine(region="eu")                 # joins at the newest weights, serves at once
    source.remove_engine(node_id, drain=True)                # finishes its groups, then leaves
    source.stop()
    flywheel pool add|remove|status RUN_DIR ...              # the same, from a shell, while `flywheel train` runs

How it works. The driver (this class, inside the trainer-side loop) owns the work: it picks each group's task
and seed and submits `EngineActor.run_group` calls, keeping `max_groups_in_flight` per engine (async mode) or
exactly the requested groups (sync mode). It remembers which groups each engine holds, so when an engine dies
(`RayActorError`) its groups are re-queued on live engines (`rollout/requeued`; a group that failed on
`ray.max_group_attempts` engines is dropped and counted in `rollout/lost_groups`) and nothing is lost. A removed
engine drains (its groups finish, none are added) or, with drain=False, is killed and its groups handed back.

Graders (`orchestrator.ray.num_graders` > 0): a pool of `GraderActor`s started before the engines; every engine
gets all their handles and sends each session's changes (not its directory) to the least-loaded one, retrying on
another when one dies (`rollout/grader_retries`; see orchestrator/grader.py). With 0 graders each engine grades
its own sessions, as the local backend does. `grader/num_graded` sums what the live graders have graded.

`get` collects every future that is ready in one `ray.wait` (the first wait blocks up to `timeout_s`, the rest
is taken with timeout 0), queues the extra groups and hands them out on the next calls, one per call; the
futures of every engine found dead in that pass are re-queued in the same pass, after its finished groups are
kept.

Weights: the trainer publishes to the weight store (the source of truth). One origin relay serves the store;
each region gets one relay whose upstream is the origin, and the engines of a region subscribe through it. The
trainer side therefore sends each version once per region, not once per engine. Metrics per region:
`weights/region/<r>/upstream_mb` (bytes the region pulled from the trainer's origin), `.../served_mb` (bytes its
relay served to its engines), `staleness/region/<r>` (newest store version minus the oldest engine version in the
region), and `weights/trainer_egress_mb` (bytes the origin sent in all).

The Ray import lives here and in trainer_service.py (RayTrainer) only; the local backend never imports Ray.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.config import FlywheelConfig
from flywheel.orchestrator.node import NodeSpec
from flywheel.orchestrator.pacing import Permits, paced
from flywheel.orchestrator.ray_actors import EngineActor, GraderActor, RelayActor
from flywheel.orchestrator.task_sampler import task_sampler
from flywheel.weights.sync import open_source

STATS_EVERY_S = 2.0  # relay counters and the store's newest version are read at most this often
# Async mode: groups queued on an engine beyond those it runs (its rollout worker's session slots hold the
# rest back). The driver only hands out work between trainer steps; without a queue an engine that finishes
# its groups during a step idles until the step returns (measured: engine busy 0.55 against 0.98 locally).
ASYNC_QUEUED_PER_RUNNING = 1
GRADER_MAX_RESTARTS = 3  # a grader that crashes comes back under the same handle this many times


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("orchestrator.backend = 'ray' needs Ray: pip install 'flywheel[ray]' "
                          "(or set orchestrator.backend = 'local')") from None
    return ray


def init_ray(cfg: FlywheelConfig):
    """Connect to `orchestrator.ray.address`, or start a local Ray; a no-op when Ray is already initialised."""
    ray = _ray()
    if not ray.is_initialized():
        address = cfg.orchestrator.ray.address
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    return ray


def as_actor(cls, **options):
    """The one place a plain flywheel class becomes a Ray actor."""
    return _ray().remote(cls).options(**options)


@dataclass
class Job:
    """One group: the unit of work, of re-queueing and of accounting."""

    task_index: int
    seed: int
    group_id: str
    min_version: int = 0
    attempts: int = 0


@dataclass
class Engine:
    node_id: int
    region: str
    spec: NodeSpec
    actor: Any
    ready_ref: Any = None  # set while the engine is joining
    inflight: dict = field(default_factory=dict)  # ObjectRef -> Job
    draining: bool = False
    stats: dict = field(default_factory=dict)
    joined_version: int | None = None


class PoolControl:
    """The CLI's channel into a running pool: `RUN_DIR/pool/commands.jsonl` (appended), `status.json` (written)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "pool"
        self.commands = self.dir / "commands.jsonl"
        self.status = self.dir / "status.json"
        self._offset = 0

    @staticmethod
    def send(run_dir: Path, op: str, **kwargs: Any) -> None:
        if op not in ("add", "remove"):
            raise ValueError(f"pool command '{op}' is unknown; use 'add' or 'remove'")
        d = Path(run_dir) / "pool"
        d.mkdir(parents=True, exist_ok=True)
        with (d / "commands.jsonl").open("a") as f:
            f.write(json.dumps({"op": op, **kwargs}) + "\n")

    def poll(self) -> list[dict]:
        """New complete command lines since the last poll; malformed lines are skipped, never fatal."""
        if not self.commands.exists():
            return []
        with self.commands.open() as f:
            f.seek(self._offset)
            text = f.read()
        end = text.rfind("\n") + 1  # a line still being written waits for the next poll
        self._offset += len(text[:end].encode())
        out = []
        for line in text[:end].splitlines():
            try:
                cmd = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(cmd, dict) and cmd.get("op") in ("add", "remove"):
                out.append(cmd)
        return out

    def write_status(self, status: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1))
        tmp.replace(self.status)


class RayRollouts:
    """The trainer's handle on a pool of engine actors; see the module docstring."""

    def __init__(self, specs: list[NodeSpec], cfg: FlywheelConfig, run_dir: Path | None = None):
        if not specs:
            raise ValueError("RayRollouts needs at least one NodeSpec (orchestrator.num_engines >= 1)")
        self.cfg = cfg
        self.mode = cfg.orchestrator.mode
        self.template = specs[0]
        self.store_url = specs[0].store_url  # the trainer's store, served by the origin relay
        # the loop puts node caches at RUN_DIR/cache/node<n>
        self.run_dir = Path(run_dir) if run_dir is not None else Path(specs[0].cache_dir).parent.parent
        self.control = PoolControl(self.run_dir)
        self.specs = specs
        self.engines: dict[int, Engine] = {}
        self.pending: deque[Job] = deque()
        self.rng = random.Random(specs[0].seed * 7919 + 17)
        self.sampler = task_sampler(specs[0].tasks, self.rng, self.cfg.orchestrator)
        self.counters = {"requeued": 0, "lost_groups": 0, "engines_died": 0, "engines_added": 0,
                         "engines_removed": 0, "groups": 0}
        self.origin: Any = None  # the RelayActor handle once started
        self.origin_url = ""
        self.relays: dict[str, tuple[Any, str]] = {}  # region -> (actor, url)
        self._next_node_id = max(s.node_id for s in specs) + 1
        self._num_jobs = 0
        self._pool_stats: dict = {}
        self._t_stats = 0.0
        self.graders: list = []  # GraderActor handles, given to every engine
        self._ready: deque[tuple[str, int, Any, dict]] = deque()  # groups collected but not yet returned
        # paced async mode (orchestrator/pacing.py): fresh groups start only with a permit the loop granted
        self.permits = Permits(paced(cfg))

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 300.0) -> None:
        """Start the origin relay, the graders and the engines; TimeoutError if they are not all up within
        `timeout_s` (the caller's `stop` then kills what did start)."""
        ray = init_ray(self.cfg)

        deadline = time.monotonic() + timeout_s
        late = TimeoutError(f"engine actors did not start within {timeout_s:g} s (each loads the model and warms up; "
                            "the cluster may be short of CPUs or busy); raise orchestrator.start_timeout_s")
        store = Path(self.store_url)
        self.origin = as_actor(RelayActor, num_cpus=0).remote(store=str(store.resolve()) if store.exists() else self.store_url)
        try:
            self.origin_url = ray.get(self.origin.url.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise late from None
        self._start_graders()
        regions = self.cfg.orchestrator.ray.regions
        for spec in self.specs:
            region = spec.region or (regions[spec.node_id % len(regions)] if regions else "default")
            self._launch(spec, region)
        while any(e.ready_ref is not None for e in self.engines.values()):
            if time.monotonic() > deadline:
                raise late
            self._check_joining(timeout_s=1.0)
        self._fill()

    def stop(self, timeout_s: float = 30.0) -> dict:
        ray = _ray()
        live = [e.stats for e in self.engines.values() if e.stats]
        stats = {k: sum(float(s[k]) for s in live) / len(live) for k in (live[0] if live else {})
                 if all(isinstance(s.get(k), (int, float)) for s in live)}
        stats.update(self.pool_stats(force=True))
        for e in list(self.engines.values()):
            self._kill(e)
        for actor, _ in self.relays.values():
            ray.kill(actor)
        if self.origin is not None:
            ray.kill(self.origin)
        for g in self.graders:
            ray.kill(g)
        self.graders = []
        self.relays.clear()
        self.origin = None
        return stats

    # ------------------------------------------------------------------ elastic pool

    def add_engine(self, region: str | None = None) -> int:
        """Start one more engine (in `region`, default: the first configured one); returns its node id.

        It joins by pulling the newest anchor and deltas through its region's relay, then takes work."""
        node_id = self._next_node_id
        region = region or (self.cfg.orchestrator.ray.regions[0] if self.cfg.orchestrator.ray.regions else "default")
        spec = dataclasses.replace(self.template, node_id=node_id, region="",
                                   cache_dir=str(self.run_dir / "cache" / f"node{node_id}"))
        self._launch(spec, region)
        self.counters["engines_added"] += 1
        return node_id

    def remove_engine(self, node_id: int, drain: bool = True) -> None:
        """Take an engine out: drain=True lets its groups finish first; drain=False hands them back at once."""
        if node_id not in self.engines:
            raise ValueError(f"no engine {node_id} in the pool; engines: {sorted(self.engines)}")
        e = self.engines[node_id]
        self.counters["engines_removed"] += 1
        if drain and e.inflight:
            e.draining = True
            return
        for job in e.inflight.values():
            self.pending.appendleft(job)
        e.inflight.clear()
        self._kill(e)
        self._fill()

    def _start_graders(self) -> None:
        """`ray.num_graders` GraderActors (none: engines grade in-process). Ray restarts a crashed one (up to
        GRADER_MAX_RESTARTS times, same handle); one killed for good is routed around by the engines."""
        o = self.cfg.orchestrator
        env = self.cfg.env.model_dump(mode="json")
        self.graders = [as_actor(GraderActor, num_cpus=o.ray.grader_num_cpus, max_concurrency=o.ray.grader_concurrency,
                                max_restarts=GRADER_MAX_RESTARTS, name=f"flywheel-grader-{self.cfg.name}-{i}")
                        .remote(env, str(self.run_dir / "cache" / f"grader{i}"))
                        for i in range(o.ray.num_graders)]

    def _launch(self, spec: NodeSpec, region: str) -> None:
        spec = dataclasses.replace(spec, region=region, store_url=self._relay_url(region))
        o = self.cfg.orchestrator
        actor = as_actor(EngineActor, num_cpus=o.ray.engine_num_cpus, num_gpus=o.ray.engine_num_gpus,
                        max_concurrency=1000, max_restarts=0,
                        name=f"flywheel-engine-{self.cfg.name}-{spec.node_id}").remote(spec, graders=self.graders)
        e = Engine(spec.node_id, region, spec, actor)
        e.ready_ref = actor.ready.remote()
        self.engines[spec.node_id] = e
        self._next_node_id = max(self._next_node_id, spec.node_id + 1)

    def _relay_url(self, region: str) -> str:
        if region not in self.relays:
            w = self.cfg.weights
            actor = as_actor(RelayActor, num_cpus=0).remote(upstream=self.origin_url, bandwidth_mbps=w.relay_bandwidth_mbps,
                                                           streams=w.relay_streams)
            self.relays[region] = (actor, _ray().get(actor.url.remote(), timeout=120))
        return self.relays[region][1]

    def _kill(self, e: Engine) -> None:
        _ray().kill(e.actor)
        self.engines.pop(e.node_id, None)

    # ------------------------------------------------------------------ work

    def request(self, num_groups: int, min_version: int) -> None:
        """Sync mode: queue `num_groups` groups to be run at weights `min_version` or newer."""
        for _ in range(num_groups):
            self.pending.append(self._new_job(min_version))
        self._fill()

    @property
    def num_engines(self) -> int:
        """Engines in the pool now (joining ones included)."""
        return len(self.engines)

    def allow(self, num_groups: int) -> None:
        """Paced async mode: `num_groups` more fresh groups may start, on whichever engines have room."""
        self.permits.give(num_groups)
        self._fill()

    def _new_job(self, min_version: int = 0) -> Job:
        self._num_jobs += 1
        index = self.sampler.next()
        task = self.template.tasks[index]
        return Job(index, self.rng.randrange(1 << 30), f"r{self._num_jobs}/{task.id}", min_version)

    def _fill(self) -> None:
        """Give live engines work: re-queued/requested groups first, then (async mode) fresh ones."""
        live = [e for e in self.engines.values() if e.ready_ref is None and not e.draining]
        if not live:
            return
        depth = 1 + (ASYNC_QUEUED_PER_RUNNING if self.mode == "async" else 0)
        for e in sorted(live, key=lambda e: len(e.inflight)):
            while len(e.inflight) < e.spec.max_groups_in_flight * depth:
                if self.pending:
                    job = self.pending.popleft()
                elif self.mode == "async" and self.permits.take():
                    job = self._new_job()
                else:
                    break
                job.attempts += 1
                e.inflight[e.actor.run_group.remote(job.task_index, job.seed, job.group_id, job.min_version)] = job

    def _lose_engine(self, e: Engine, why: str) -> None:
        self.counters["engines_died"] += 1
        self._pool_stats["pool/last_error"] = f"engine {e.node_id} lost: {why[:500]}"
        for job in e.inflight.values():
            if job.attempts >= self.cfg.orchestrator.ray.max_group_attempts:
                self.counters["lost_groups"] += 1
                self.permits.give(1)  # paced: a lost group never reaches the loop; its permit starts another
            else:
                self.counters["requeued"] += 1
                self.pending.appendleft(job)
        e.inflight.clear()
        self._kill(e)

    def _check_joining(self, timeout_s: float) -> None:
        ray = _ray()
        joining = {e.ready_ref: e for e in self.engines.values() if e.ready_ref is not None}
        if not joining:
            return
        done, _ = ray.wait(list(joining), num_returns=len(joining), timeout=timeout_s)
        for ref in done:
            e = joining[ref]
            try:
                e.joined_version = ray.get(ref)  # the version it pulled from the store before taking work
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                self._lose_engine(e, f"failed to start: {err}")
                continue
            e.ready_ref = None
            e.stats.setdefault("node/version", e.joined_version)

    def get(self, timeout_s: float) -> tuple[str, int, Any, dict] | None:
        """The next finished group as ("group", node_id, group, stats), or None when none came in `timeout_s`.

        One `ray.wait` collects every ready future; the extra groups are queued and returned by the next calls."""
        ray = _ray()
        self._apply_commands()
        self._check_joining(timeout_s=0)
        self._fill()
        if self._ready:
            return self._ready.popleft()
        owner = {ref: e for e in self.engines.values() for ref in e.inflight}
        if not owner:
            if not self.engines:
                raise RuntimeError("the Ray engine pool is empty: every engine died or was removed; "
                                   "add one with `flywheel pool add RUN_DIR`")
            time.sleep(min(timeout_s, 0.2))
            return None
        refs = list(owner)
        done, rest = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not done:
            return None
        if rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            done = done + more
        self._collect(done, owner)
        self._fill()
        return self._ready.popleft() if self._ready else None

    def _collect(self, done: list, owner: dict) -> None:
        """Take every ready future: finished groups to `_ready`; engines found dead lose their remaining groups
        (re-queued) once, after their finished ones are kept."""
        ray = _ray()
        dead: dict[int, tuple[Engine, str]] = {}
        collected: list[tuple[str, int, Any, dict]] = []
        for ref in done:
            e = owner[ref]
            if ref not in e.inflight:  # already handed back (engine removed without drain)
                continue
            try:
                group, stats = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                dead.setdefault(e.node_id, (e, str(err)))  # its job stays in inflight: re-queued below
                continue
            except ray.exceptions.RayTaskError:  # the group itself failed (not the engine): count, go on
                e.inflight.pop(ref)
                self.counters["lost_groups"] += 1
                self.permits.give(1)
                continue
            job = e.inflight.pop(ref)
            self.sampler.observe_group(job.task_index, group)
            self.counters["groups"] += 1
            collected.append(("group", e.node_id, group, stats))
        # ray.wait lists ready futures in submission order, not completion order: hand them out oldest stats
        # first (an engine's session count only grows), so the loop's per-engine metrics never step back
        collected.sort(key=lambda m: float(m[3].get("rollout/sessions", 0.0)))
        for _, node_id, _, stats in collected:
            if node_id in self.engines:
                self.engines[node_id].stats = stats
        self._ready.extend(collected)
        for e, why in dead.values():
            if e.node_id in self.engines:
                self._lose_engine(e, why)
        for e in list(self.engines.values()):
            if e.draining and not e.inflight:
                self._kill(e)

    def _apply_commands(self) -> None:
        for cmd in self.control.poll():
            try:
                if cmd["op"] == "add":
                    for _ in range(int(cmd.get("num_engines", 1))):
                        self.add_engine(region=cmd.get("region"))
                else:
                    self.remove_engine(int(cmd["node_id"]), drain=bool(cmd.get("drain", True)))
            except (ValueError, KeyError, TypeError) as err:  # a bad command is reported, never fatal
                self._pool_stats["pool/last_error"] = f"{cmd}: {err}"

    # ------------------------------------------------------------------ metrics

    def pool_stats(self, force: bool = False) -> dict:
        """Pool counters, per-region weight bytes and staleness (refreshed at most every STATS_EVERY_S)."""
        now = time.monotonic()
        if not force and now - self._t_stats < STATS_EVERY_S:  # counters fresh, relay figures cached
            return {**{k: v for k, v in self._pool_stats.items() if not isinstance(v, str)},
                    **{f"rollout/{k}": float(v) for k, v in self.counters.items()},
                    **self.sampler.stats(), "pool/num_engines": float(len(self.engines))}
        self._t_stats = now
        ray = _ray()

        s: dict = {f"rollout/{k}": float(v) for k, v in self.counters.items()}
        s.update(self.sampler.stats())
        s["pool/num_engines"] = float(len(self.engines))
        try:
            latest = open_source(self.store_url).latest_version()
        except OSError:
            latest = None
        status_regions: dict = {}
        for region, (actor, url) in self.relays.items():
            try:
                r = ray.get(actor.stats.remote(), timeout=10)
            except (ray.exceptions.RayError, TimeoutError):
                continue
            s[f"weights/region/{region}/upstream_mb"] = r["bytes_upstream"] / 1e6
            s[f"weights/region/{region}/served_mb"] = r["bytes_out"] / 1e6
            versions = [int(v) for e in self.engines.values()
                        if e.region == region and (v := e.stats.get("node/version")) is not None]
            if latest is not None and versions:
                s[f"staleness/region/{region}"] = float(latest - min(versions))
            status_regions[region] = {"relay": url, "num_engines": sum(e.region == region for e in self.engines.values())}
        if self.graders:
            graded = []
            for g in self.graders:
                try:
                    graded.append(ray.get(g.stats.remote(), timeout=10)["num_graded"])
                except (ray.exceptions.RayError, TimeoutError):
                    continue
            s["grader/num_graded"] = float(sum(graded))
            s["pool/num_graders_up"] = float(len(graded))
        if self.origin is not None:
            try:
                s["weights/trainer_egress_mb"] = ray.get(self.origin.stats.remote(), timeout=10)["bytes_out"] / 1e6
            except (ray.exceptions.RayError, TimeoutError):
                pass
        self._pool_stats.update(s)
        self.control.write_status({
            "time": time.time(), "store_version": latest, "regions": status_regions, "counters": self.counters,
            "engines": [{"node_id": e.node_id, "region": e.region, "joining": e.ready_ref is not None,
                         "draining": e.draining, "groups_in_flight": len(e.inflight),
                         "joined_version": e.joined_version, "version": e.stats.get("node/version")}
                        for e in self.engines.values()]})
        return s
