"""Ray backend of the sharded trainer: one `RankActor` per rank in a placement group.

    trainer = RayTrainerGroup(cfg, run_dir, base_model_dir)   # via trainers.build_trainer (world_size > 1)

Why so: the shape OpenRLHF and verl use. A placement group reserves one bundle per rank (`ray.trainer_num_cpus`,
`ray.trainer_num_gpus` each), packed onto as few nodes as possible; rank 0's actor names a TCP rendezvous on its
node and every actor joins the process group there, then builds its `TrainerService` over its shards. The driver
calls each method on every actor at once (they are collectives) and keeps rank 0's answer. When an actor dies,
`ray.wait` hands back its `RayActorError` while the others may still be blocked in a collective: the handle
kills every actor and the placement group at once and starts a fresh group that resumes from the newest
checkpoint (trainer_group.GroupHandle). `RankActor` is a plain class; `ray.remote` is applied here only.
"""

from __future__ import annotations

import socket
from typing import Any

from flywheel.config import FlywheelConfig
from flywheel.orchestrator.ray import init_ray
from flywheel.orchestrator.trainer_group import GroupFailed, GroupHandle, run_method
from flywheel.orchestrator.trainer_service import TrainerService
from flywheel.trainer.distributed import init_group


class RankActor:
    """One rank of the sharded trainer inside a Ray actor."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.service: TrainerService | None = None

    def rendezvous(self) -> str:
        """A TCP init_method on this actor's node (rank 0's): a port free now."""
        import ray  # inside the actor, where Ray is running (as RelayActor does)

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        return f"tcp://{host}:{port}"

    def start(self, init_method: str, config: dict, run_dir: str, base_model_dir: str, resume: bool,
              restarted: bool) -> int:
        cfg = FlywheelConfig.model_validate(config)
        group = init_group(cfg.trainer, init_method=init_method, rank=self.rank, world_size=self.world_size)
        self.service = TrainerService(config, run_dir, base_model_dir, resume, restarted=restarted, group=group)
        return self.rank

    def call(self, method: str, args: tuple) -> tuple[str, Any]:
        assert self.service is not None, "RankActor.start must run first"
        return run_method(self.service, method, args)


class RayTrainerGroup(GroupHandle):
    """The Ray backend's handle on a sharded trainer group; see the module docstring."""

    def _start(self, resume: bool, restarted: bool) -> None:
        ray = self.ray = init_ray(self.cfg)
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._remove_pg = remove_placement_group
        o, ws = self.cfg.orchestrator, self.cfg.trainer.world_size
        bundle = {"CPU": o.ray.trainer_num_cpus}
        if o.ray.trainer_num_gpus:
            bundle["GPU"] = o.ray.trainer_num_gpus
        self.pg = placement_group([dict(bundle) for _ in range(ws)], strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=o.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"Ray could not reserve {ws} bundles of {bundle} for the trainer group within "
                               f"{o.start_timeout_s:g} s; lower orchestrator.ray.trainer_num_cpus or add nodes") from None
        self.actors = [ray.remote(RankActor).options(
            num_cpus=o.ray.trainer_num_cpus, num_gpus=o.ray.trainer_num_gpus, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
            name=f"flywheel-trainer-{self.cfg.name}-rank{r}").remote(r, ws) for r in range(ws)]
        init = ray.get(self.actors[0].rendezvous.remote())
        config = self.cfg.model_dump(mode="json")
        self._wait([a.start.remote(init, config, str(self.run_dir), str(self.base_model_dir), resume, restarted)
                    for a in self.actors])

    def _wait(self, refs: list) -> list:
        """Every result, or GroupFailed as soon as one actor is found dead."""
        ray = self.ray
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as err:
                raise GroupFailed(f"a trainer rank actor died: {err}") from err
        return ray.get(refs)

    def _send(self, method: str, args: tuple) -> tuple[str, Any]:
        return self._wait([a.call.remote(method, args) for a in self.actors])[0]

    def _stop(self) -> None:
        ray = self.ray
        for a in getattr(self, "actors", []):
            ray.kill(a, no_restart=True)
        self.actors = []
        if getattr(self, "pg", None) is not None:
            self._remove_pg(self.pg)
            self.pg = None

    def kill_rank(self, rank: int) -> None:
        """Fault injection for tests: end one rank's actor as a crash would."""
        self.ray.kill(self.actors[rank], no_restart=True)
