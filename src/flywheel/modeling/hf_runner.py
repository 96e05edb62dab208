"""The fallback runner: any HF causal LM through its own forward, one sequence at a time.

    runner = HFRunner(model, max_seq_len)      # what modeling.runner.runner_for picks off the registry

Used for model types the native runner does not cover (modeling/families.py says why, and runner_for logs it).
Each sequence keeps its own HF cache and decodes with batch size 1, so outputs are trivially batch-invariant with
respect to other sequences; it is correct but slower than the native runner, since a step costs one HF forward
per live sequence. It reuses no prefixes, has no batch-invariant mode (its kernels are not the trainer's exact
path) and reports no routed experts.

The cache keyword is read off the model's `forward` signature: transformers 5 names it `cache`, 4.x
`past_key_values` (an unknown keyword would fall into `**kwargs` and decode without a cache).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class HFCache:
    capacity: int
    past: Any = None
    length: int = 0


def cache_keyword(model) -> str:
    """The name the model's forward takes its KV cache under (`cache` in transformers 5, else `past_key_values`)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFRunner:
    is_moe = False
    reuses_prefixes = False
    adds_lora_factors = False  # the HF module's own forward: an unmerged adapter would be ignored
    batch_invariant = False

    def __init__(self, model, max_seq_len: int):
        self.model = model
        self.device = next(model.parameters()).device
        self._cache_kw = cache_keyword(model)

    def new_cache(self, capacity: int) -> HFCache:
        return HFCache(capacity)

    def detach(self, cache: HFCache) -> HFCache:
        return cache

    def _forward(self, ids: list[int], cache: HFCache) -> torch.Tensor:
        input_ids = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache.past})
        cache.past = out.cache if "cache" in out else out.past_key_values
        cache.length += len(ids)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def prefill(self, ids: list[int], cache: HFCache, start: int = 0):
        if start:
            raise ValueError("the HF fallback reuses no prefixes: prefill from an empty cache")
        return self._forward(ids, cache), None

    @torch.inference_mode()
    def decode(self, tokens: list[int], caches: list[HFCache]):
        return torch.stack([self._forward([t], c) for t, c in zip(tokens, caches)]), None
