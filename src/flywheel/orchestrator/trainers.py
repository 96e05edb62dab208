"""Which trainer handle a run gets: the one place that knows every kind.

    trainer = build_trainer(cfg, run_dir, base_model_dir, resume=False)   # a TrainerHandle (orchestrator/source.py)

Why its own module: the handles import the service they drive (trainer_service.py) and the group launchers
import the handle base (trainer_group.py); a factory inside any of them would close an import cycle.
"""

from __future__ import annotations

from pathlib import Path

from flywheel.config import FlywheelConfig
from flywheel.orchestrator.ray_trainer_group import RayTrainerGroup
from flywheel.orchestrator.source import TrainerHandle
from flywheel.orchestrator.trainer_group import GroupHandle, TorchrunTrainer
from flywheel.orchestrator.trainer_service import LocalTrainer, RayTrainer


def build_group_trainer(cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, resume: bool = False) -> GroupHandle:
    """The sharded trainer group of `cfg.orchestrator.backend`."""
    if cfg.orchestrator.backend == "ray":
        return RayTrainerGroup(cfg, run_dir, base_model_dir, resume)
    return TorchrunTrainer(cfg, run_dir, base_model_dir, resume)


def build_trainer(cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, resume: bool = False) -> TrainerHandle:
    """The trainer side of `cfg.orchestrator.backend`: in this process (local) or a Ray actor (ray); with
    `trainer.world_size > 1` a sharded group (torchrun or Ray actors, orchestrator/trainer_group.py)."""
    if cfg.trainer.world_size > 1:
        return build_group_trainer(cfg, run_dir, base_model_dir, resume)
    if cfg.orchestrator.backend == "ray":
        return RayTrainer(cfg, run_dir, base_model_dir, resume)
    return LocalTrainer(cfg, run_dir, base_model_dir, resume)
