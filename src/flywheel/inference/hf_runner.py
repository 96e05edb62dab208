"""The generic path: any HF causal LM through its own forward, one sequence at a time.

Used by LocalEngine for architectures without a native runner (flywheel/numerics/qwen3.py covers the
Qwen3 family). Each sequence keeps its own HF cache (`past_key_values`) and decodes with batch size 1,
so outputs are trivially batch-invariant; it is correct but slower than the native runner, since a step
costs one HF forward per live sequence. Routed experts are not reported on this path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class HFCache:
    capacity: int
    past: Any = None
    length: int = 0


class HFRunner:
    is_moe = False

    def __init__(self, model, max_seq_len: int):
        self.model = model
        self.device = next(model.parameters()).device

    def new_cache(self, capacity: int) -> HFCache:
        return HFCache(capacity)

    def _forward(self, ids: list[int], cache: HFCache) -> torch.Tensor:
        input_ids = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.past, use_cache=True)
        cache.past = out.past_key_values
        cache.length += len(ids)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def prefill(self, ids: list[int], cache: HFCache):
        return self._forward(ids, cache), None

    @torch.inference_mode()
    def decode(self, tokens: list[int], caches: list[HFCache]):
        return torch.stack([self._forward([t], c) for t, c in zip(tokens, caches)]), None
