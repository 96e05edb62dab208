"""The Engine protocol: what rollout workers and the weight subscriber need from inference.

    gen = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=128))
    gen.token_ids, gen.logprobs, gen.versions, gen.routed_experts

Implementations: `local` (torch; flywheel/inference/local.py). Many agent sessions call one engine
concurrently; the engine batches their decode steps. `update_weights` is thread-safe and swaps
between decode steps: tokens before the swap carry the old version, tokens after it the new one.
A rejected update (wrong names, shapes or dtypes) raises ValueError and leaves the old weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from flywheel.types import Generation, SamplingParams


@runtime_checkable
class Engine(Protocol):
    @property
    def version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    def update_weights(self, version: int, tensors: Mapping[str, object]) -> float:
        """Install `tensors` (name -> torch.Tensor, the model's state-dict names) as `version`.

        Returns the pause in milliseconds (time decoding was held). Thread-safe."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...
