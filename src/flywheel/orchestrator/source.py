"""The protocols between the RL loop and the two sides it drives: a pool of inference engines that produce
rollout groups (`RolloutSource`) and the trainer (`TrainerHandle`).

    source = build_rollouts(cfg, specs)      # LocalRollouts (child processes) or RayRollouts (actors)
    source.start(timeout_s=300); source.allow(4); msg = source.get(timeout_s=0.5); source.stop()

Why a protocol: the loop (orchestrator/loop.py) is the same for both backends; what it may call is written
down here instead of probed with `hasattr`. `get` returns `("group", node_id, trajectories, node_stats)` or
None on timeout; `request` is the sync mode's "exactly these groups, from this version on"; `allow` is the
paced async mode's grant of group starts; `pool_stats` is pool-wide counters (empty where there is no pool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class RolloutSource(Protocol):
    @property
    def num_engines(self) -> int: ...

    def start(self, timeout_s: float = 300.0) -> None: ...

    def get(self, timeout_s: float) -> tuple[str, int, Any, dict] | None: ...

    def request(self, num_groups: int, min_version: int) -> None: ...

    def allow(self, num_groups: int) -> None: ...

    def pool_stats(self) -> dict: ...

    def stop(self, timeout_s: float = 60.0) -> dict: ...


class TrainerHandle(Protocol):
    """What the loop holds of the trainer side (orchestrator/trainer_service.py): `LocalTrainer` in this
    process or `RayTrainer` over an actor. `version` is the newest published weight version, `store_url`
    where engines subscribe, `extra_state` the loop's state restored from the checkpoint."""

    store_url: str
    extra_state: dict

    @property
    def version(self) -> int: ...

    def step(self, batch: list) -> dict[str, float]: ...

    def publish(self) -> None: ...

    def publisher_metrics(self) -> list[dict]: ...

    def flush(self) -> None: ...

    def save_checkpoint(self, extra_state: dict) -> str: ...

    def save_model(self, path: str | Path) -> None: ...

    def close(self) -> None: ...
