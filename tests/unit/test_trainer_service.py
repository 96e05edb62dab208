"""The trainer side the RL loop drives (`TrainerService`): built from a config and a base-model directory."""

import pytest
from test_trainer import batch, tiny

from flywheel.config import FlywheelConfig
from flywheel.orchestrator.trainer_service import TrainerService
from flywheel.policy.model import save_model


def test_kl_coef_gets_the_base_model_as_its_frozen_reference(tmp_path):
    """`trainer.kl_coef > 0` from a config used to fail with 'needs a reference model': the service now
    loads the base model a second time as the KL anchor, and the anchor stays where RL started."""
    base = tiny()
    save_model(base, tmp_path / "base")
    cfg = FlywheelConfig.model_validate({"trainer": {"kl_coef": 0.1, "lr": 3e-3}})
    service = TrainerService(cfg.model_dump(mode="json"), str(tmp_path / "run"), str(tmp_path / "base"))
    try:
        assert service.step(batch(base))["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == anchor at step 0
        assert service.step(batch(base))["kl"] > 1e-6
        ref = service.trainer.ref_model
        assert all(not p.requires_grad for p in ref.parameters())
        assert all((p == q).all() for p, q in zip(ref.parameters(), base.parameters()))
    finally:
        service.close()
