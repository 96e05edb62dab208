"""The Runner protocol the engine drives, and the choice between the native decoder and the HF fallback.

    runner = runner_for(model, max_seq_len, batch_invariant=False)
    cache = runner.new_cache(capacity); logits, routed = runner.prefill(ids, cache)
    logits_bv, routed = runner.decode(last_tokens, caches)

Why a protocol: the engine (inference/local.py) asks a runner what it can do (`reuses_prefixes`, `is_moe`,
`batch_invariant`, `adds_lora_factors`) instead of branching on its class, so a new runner is a new
implementation, not a new branch.
Implementations: `DecoderRunner` (modeling/decoder.py: every family of modeling/families.py) and `HFRunner`
(modeling/hf_runner.py: any other HF causal LM, one sequence at a time; the reason is logged).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import torch

from flywheel.modeling.decoder import DecoderRunner
from flywheel.modeling.families import native_family
from flywheel.modeling.hf_runner import HFRunner

log = logging.getLogger(__name__)


@runtime_checkable
class Runner(Protocol):
    is_moe: bool
    reuses_prefixes: bool  # prefill(ids, cache, start=n) continues a cache holding ids[:n]
    batch_invariant: bool
    adds_lora_factors: bool  # its projections add an adapter hung unmerged on their nn.Linear (modeling/lora.py)

    def new_cache(self, capacity: int) -> Any: ...

    def prefill(self, ids: list[int], cache: Any, start: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def decode(self, tokens: list[int], caches: list[Any]) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def detach(self, cache: Any) -> Any:
        """A standalone copy of the cache for a prefix store (its pool slot, if any, given back)."""
        ...


def runner_for(model, max_seq_len: int, batch_invariant: bool = False, kv_dtype: str = "bf16") -> Runner:
    """The native runner when the model's family is in the registry, else the HF fallback (logged).
    `batch_invariant` needs the native runner: the fallback's kernels are not the trainer's exact path."""
    family, why_not = native_family(model, max_seq_len)
    if family is not None:
        return DecoderRunner(model, max_seq_len, batch_invariant, kv_dtype=kv_dtype)
    if batch_invariant:
        raise ValueError(f"numerics.batch_invariant needs the native runner, which does not cover this model "
                         f"({why_not}): set numerics.batch_invariant = false")
    if kv_dtype != "bf16":
        raise ValueError(f"inference.kv_dtype = '{kv_dtype}' needs the native runner, which does not cover this "
                         f"model ({why_not}): set inference.kv_dtype = 'bf16'")
    log.warning("inference: the HF forward, one sequence at a time, for this model (%s)", why_not)
    return HFRunner(model, max_seq_len)
