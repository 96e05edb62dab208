"""The trainer side behind one small handle: in-process (local backend) or a restartable Ray actor (ray backend).

    trainer = build_trainer(cfg, run_dir, base_model_dir, resume=False)   # orchestrator/trainers.py
    metrics = trainer.step(batch); trainer.publish(); trainer.version
    trainer.save_checkpoint(loop_state); trainer.flush(); trainer.save_model(path); trainer.close()

Why so: orchestrator/loop.py drives the same `TrainerService` (Trainer + Publisher + weight store) whichever
backend runs it. With `backend = "ray"` it is a Ray actor created with `max_restarts`; a restarted actor resumes
from the newest checkpoint in its `__init__` and drops store versions newer than that checkpoint, so the weight
store stays the source of truth (engines holding a dropped version fail the next delta's hash check and take the
anchor path). The handle retries the call that met the dead actor once the actor is back (`trainer/restarts`):
a step is then re-run from the checkpointed weights; the loop keeps its buffer and admitted-group log, so no
trajectory is lost. The local backend imports nothing from Ray.

Sharded (`trainer.world_size > 1`): one TrainerService per rank, each holding its shards (`group`); every method
is then a collective that all ranks call with the same arguments (orchestrator/trainer_group.py drives them:
torchrun for the local backend, a Ray actor group for the Ray one). Publication is sharded
(weights/sharded.py), checkpoints are DCP (trainer/sharded_checkpoint.py); `save_model` gathers the full
weights on rank 0 once, for the final export.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from flywheel.config import FlywheelConfig
from flywheel.metrics.dashboard.trainer_logprobs import TrainerLogprobsWriter, sample_indices
from flywheel.modeling.lm_head import use_fp32_lm_head
from flywheel.modeling.quant import served_tensors_and_values
from flywheel.orchestrator.forwarding import ForwardingTrainer
from flywheel.orchestrator.ray import as_actor, init_ray
from flywheel.policy.model import load_model, save_model
from flywheel.trainer import checkpoint as ckpt
from flywheel.trainer.distributed import init_group, shard_model
from flywheel.trainer.train import Trainer
from flywheel.types import Trajectory
from flywheel.weights.sharded import ShardedPublisher
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher


class TrainerService:
    """Trainer + Publisher + store: everything the loop asks of the trainer side (a plain class)."""

    def __init__(self, config: dict, run_dir: str, base_model_dir: str, resume: bool = False, *,
                 restarted: bool = False, group=None):
        cfg = FlywheelConfig.model_validate(config)
        run_dir_p = Path(run_dir)
        self.base_model_dir = Path(base_model_dir)
        if cfg.trainer.world_size > 1 and group is None:  # a rank under torchrun: rendezvous from the environment
            group = init_group(cfg.trainer)
        self.group = group
        self.cfg = cfg
        base = use_fp32_lm_head(load_model(self.base_model_dir, cfg.model.dtype), cfg.numerics.fp32_lm_head)
        # the KL anchor is the policy RL started from: a frozen copy of the base model, taken before a resume
        # loads the checkpoint's weights into `model` (a copy in memory, not a second read of the directory)
        base_ref = copy.deepcopy(base) if cfg.trainer.kl_coef > 0 else None
        model: torch.nn.Module = base
        ref_model: torch.nn.Module | None = base_ref
        if group is not None:
            model = shard_model(base, group, cfg.trainer)
            ref_model = shard_model(base_ref, group, cfg.trainer) if base_ref is not None else None
        self.trainer = Trainer(model, cfg.trainer, run_dir_p, pad_token_id=base.config.pad_token_id or 0,
                               temperature=cfg.rollout.temperature or 1.0, batch_invariant=cfg.numerics.batch_invariant,
                               ref_model=ref_model, group=group)
        restarted = restarted or _restarted_actor()
        has_ckpt = ckpt.latest_checkpoint(run_dir_p / "checkpoints") is not None
        self.extra_state = self.trainer.load_checkpoint() if (resume or (restarted and has_ckpt)) else {}
        store = WeightStore(cfg.weights.store or str(run_dir_p / "weights"))
        main = group is None or group.is_main
        latest = store.latest_version() if main else None
        if main and latest is not None and latest > self.trainer.version:  # killed after publishing, before checkpointing
            store.drop_versions_after(self.trainer.version)
        self.store_url = store.url
        # a sample of each batch's recomputed per-token log-probs, for the rollout browser (rank 0 writes)
        self.logprobs_writer = (TrainerLogprobsWriter(run_dir_p) if main and cfg.metrics.trainer_logprobs_per_step
                                else None)
        self.publisher: Publisher | ShardedPublisher
        if group is not None:
            group.barrier()  # the store's versions are settled before any rank reads them
            self.publisher = ShardedPublisher.from_config(store, group, cfg.weights)
        else:
            self.publisher = Publisher.from_config(store, cfg.weights, **served_form(cfg))
        empty = store.latest_version() is None if main else None
        if (group.broadcast_object(empty) if group is not None else empty):
            self.publisher.publish(self.trainer.version, self.trainer.state_dict_for_publish(),
                                   adapter=self.trainer.publish_meta())
            self.publisher.flush()

    def info(self) -> dict:
        pids = [os.getpid()] if self.group is None else self.group.all_gather_objects(os.getpid())
        return {"version": self.trainer.version, "store_url": self.store_url, "extra_state": self.extra_state,
                "pids": pids}

    @property
    def version(self) -> int:
        return self.trainer.version

    def step(self, batch: list[Trajectory]) -> dict[str, float]:
        metrics = self.trainer.step(batch)
        if self.logprobs_writer is not None and not metrics.get("step_skipped"):
            items = [(batch[i], lps) for i in sample_indices(len(batch), self.cfg.metrics.trainer_logprobs_per_step)
                     if (lps := self.trainer.recomputed_logprobs(i)) is not None]
            metrics["trainer/logprobs_written_kb"] = self.logprobs_writer.write(self.trainer.version, items) / 1e3
        return metrics

    def publish(self) -> None:
        """Publish the current version (encoding runs on the publisher's thread)."""
        self.publisher.publish(self.trainer.version, self.trainer.state_dict_for_publish(),
                               adapter=self.trainer.publish_meta())  # a LoRA run: the adapter and its marker

    def publisher_metrics(self) -> list[dict]:
        return self.publisher.metrics[-1:]

    def flush(self) -> None:
        self.publisher.flush()

    def save_checkpoint(self, extra_state: dict) -> str:
        return str(self.trainer.save_checkpoint(extra_state))

    def save_model(self, path: str | Path) -> None:
        """The trained policy as an HF directory. Sharded: the one place the full weights are gathered (to rank
        0, on the CPU), into a fresh copy of the base model that rank 0 saves."""
        if self.group is None:
            save_model(self.trainer.model, Path(path))
            return

        full = get_model_state_dict(self.trainer.model, options=StateDictOptions(full_state_dict=True,
                                                                                  cpu_offload=True))
        if self.group.is_main:
            model = load_model(self.base_model_dir, self.cfg.model.dtype)
            model.load_state_dict(full)
            save_model(model, Path(path))
        self.group.barrier()

    def close(self) -> None:
        self.publisher.close()


def served_form(cfg: FlywheelConfig) -> dict[str, Any]:
    """The publisher's served-form arguments (weights.publish_served): the weights as the run's engines serve them
    (inference.weight_dtype), or none when the engines serve the trainer's weights as they are."""
    fmt = cfg.inference.weight_dtype
    if not cfg.weights.publish_served or fmt == "bf16":
        return {}
    return {"served_format": fmt, "to_served": functools.partial(served_tensors_and_values, fmt=fmt)}


def _restarted_actor() -> bool:
    """True inside a Ray actor that is being reconstructed after its process died."""
    ray = sys.modules.get("ray")  # never import Ray here: the local backend runs without it
    if ray is None or not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except (AssertionError, AttributeError, RuntimeError):  # not inside an actor
        return False


class RayTrainer(ForwardingTrainer):
    """Handle on a TrainerService actor; same methods, and a dead actor is waited for and the call retried."""

    def __init__(self, cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, resume: bool = False,
                 restart_timeout_s: float = 300.0):
        self.ray = init_ray(cfg)
        o = cfg.orchestrator
        self.actor_name = f"flywheel-trainer-{cfg.name}"
        self.actor = as_actor(TrainerService, num_cpus=o.ray.trainer_num_cpus, num_gpus=o.ray.trainer_num_gpus,
                             max_restarts=o.ray.trainer_max_restarts, max_task_retries=0,
                             name=self.actor_name).remote(cfg.model_dump(mode="json"), str(run_dir),
                                                          str(base_model_dir), resume)
        self.restart_timeout_s = restart_timeout_s
        self.max_restarts = o.ray.trainer_max_restarts
        self.num_restarts = 0
        info = self._call("info")
        self.version, self.store_url, self.extra_state = info["version"], info["store_url"], info["extra_state"]

    def _call(self, method: str, *args: Any) -> Any:
        errors = self.ray.exceptions
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                return self.ray.get(getattr(self.actor, method).remote(*args))
            except errors.RayActorError as err:  # died (or is restarting): wait for it, then retry the call
                self.num_restarts += 1
                if self.num_restarts > self.max_restarts or time.monotonic() > deadline:
                    raise RuntimeError(f"the trainer actor died and did not come back (restarts: "
                                       f"{self.num_restarts - 1} of {self.max_restarts}): {err}") from err
                self._wait_alive(deadline)
                self.version = self.ray.get(self.actor.info.remote())["version"]  # resumed at its checkpoint

    def _wait_alive(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                self.ray.get(self.actor.info.remote(), timeout=30)
                return
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError,
                    self.ray.exceptions.GetTimeoutError):
                time.sleep(0.5)

    def close(self) -> None:
        try:
            self._call("close")
        finally:
            self.ray.kill(self.actor, no_restart=True)


class LocalTrainer(TrainerService):
    """The in-process handle (local backend): a TrainerService the loop calls directly."""

    def __init__(self, cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, resume: bool = False):
        super().__init__(cfg.model_dump(mode="json"), str(run_dir), str(base_model_dir), resume)

