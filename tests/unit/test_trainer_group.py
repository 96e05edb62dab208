"""The sharded trainer group behind the loop's handle (orchestrator/trainer_group.py), launched by torchrun with 2
gloo ranks: a rank killed with SIGKILL stops the group, a fresh group resumes from the newest checkpoint, the call
that met the failure is retried, and nothing is left running afterwards. ~30-40 s (three torchrun starts)."""

import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from sharded_ranks import batches, model  # noqa: E402

from flywheel.config import FlywheelConfig  # noqa: E402
from flywheel.orchestrator.trainer_group import TorchrunTrainer  # noqa: E402
from flywheel.orchestrator.trainers import build_trainer  # noqa: E402
from flywheel.policy.model import load_model, save_model  # noqa: E402
from flywheel.weights.store import WeightStore  # noqa: E402
from flywheel.weights.sync import Subscriber  # noqa: E402

pytestmark = pytest.mark.slow  # three torchrun starts, ~50-70 s on a loaded 2-core host: `make test` runs it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_rank_resumes_from_the_checkpoint_and_loses_nothing(tmp_path):
    save_model(model(), tmp_path / "base")
    cfg = FlywheelConfig.model_validate({"trainer": {"world_size": 2, "lr": 1e-3, "micro_batch_tokens": 30,
                                                     "group_max_restarts": 1},
                                         "weights": {"chunk_mb": 0.004}})
    trainer = build_trainer(cfg, tmp_path / "run", tmp_path / "base")
    assert isinstance(trainer, TorchrunTrainer) and trainer.version == 0 and len(set(trainer.pids)) == 2
    first_pids = list(trainer.pids)
    try:
        data = batches()
        trainer.step(data[0])
        trainer.publish()
        trainer.save_checkpoint({"admitted": 8, "buffer": ["g1"]})
        trainer.step(data[1])
        trainer.publish()  # version 2 is published but never checkpointed
        assert WeightStore(trainer.store_url).list_versions() == [0, 1, 2]
        os.kill(first_pids[1], 9)
        metrics = trainer.step(data[1])  # the group dies under this call; a new one resumes at 1 and retries
        assert metrics["trainer/restarts"] == 1.0 and trainer.version == 2
        assert not set(trainer.pids) & set(first_pids)
        store = WeightStore(trainer.store_url)
        assert store.list_versions() == [0, 1]  # the orphan version 2 was dropped by the resumed group
        trainer.publish()
        trainer.save_model(str(tmp_path / "final"))
        assert store.list_versions() == [0, 1, 2]
        sub = Subscriber(trainer.store_url)
        assert sub.poll() == 2  # the republished version 2 reaches a subscriber from its base chain
        final = load_model(tmp_path / "final")
        tensors = sub.tensors
        assert all(torch.equal(v.float(), tensors[k].float()) for k, v in final.state_dict().items())
        sub.close()
    finally:
        trainer.close()
    deadline = time.monotonic() + 10
    while any(map(_alive, trainer.pids + first_pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, trainer.pids + first_pids)), "trainer ranks left running"
    assert trainer.proc.returncode == 0, f"torchrun exit {trainer.proc.returncode}; its log:\n{trainer._tail()}"
