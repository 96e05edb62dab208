"""The trainer handle's methods for a trainer that lives in another process: each is one `_call`.

    class MyHandle(ForwardingTrainer):
        def _call(self, method, *args): ...        # send, wait, retry after a restart; return the value

Why: the Ray actor handle (trainer_service.RayTrainer) and the sharded groups (trainer_group.GroupHandle:
torchrun and Ray rank actors) differ only in how a call reaches the service and how a dead one comes back;
what the loop calls (orchestrator/source.TrainerHandle) is the same forwarding for all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.types import Trajectory


class ForwardingTrainer:
    """`step`, `publish`, `publisher_metrics`, `flush`, `save_checkpoint`, `save_model` over `_call`."""

    version: int
    num_restarts: int

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def step(self, batch: list[Trajectory]) -> dict[str, float]:
        metrics = self._call("step", batch)
        self.version = self._call("info")["version"]
        return {**metrics, "trainer/restarts": float(self.num_restarts)}

    def publish(self) -> None:
        self._call("publish")

    def publisher_metrics(self) -> list[dict]:
        return self._call("publisher_metrics")

    def flush(self) -> None:
        self._call("flush")

    def save_checkpoint(self, extra_state: dict) -> str:
        return self._call("save_checkpoint", extra_state)

    def save_model(self, path: str | Path) -> None:
        self._call("save_model", str(Path(path).resolve()))
