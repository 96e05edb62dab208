"""Float32 logits (`numerics.fp32_lm_head`): the output projection computed in float32 in engine and trainer.

    use_fp32_lm_head(model)            # engine's model and trainer's model alike; a no-op for float32 models
    has_fp32_lm_head(model.lm_head)    # what the native runner (modeling/decoder.py) checks in `_logits`

Why: in bfloat16 a logit of magnitude 8 is rounded to a step of 1/16. Engine and trainer reach the final hidden
state by different reduction orders (a decode step with a KV cache vs one full-sequence pass), so their
unrounded logits differ in the last bits and the bf16 rounding then turns that into whole steps of 1/32–1/16 on
many vocabulary entries at once (the MiniMax-M1 report describes the same mismatch and the same fix). Computing
`h @ W_headᵀ` in float32 (bf16 weights and hidden state upcast, nothing else changed) removes that part:
measured on the trained tiny-moe of `flywheel bench mismatch`, it was 78 % of the k3 that router replay leaves
(k3 with replay falls 4.6×; docs/numerics.md).

How: the head module's `forward` is replaced on the instance (its type, parameters and state-dict keys stay, so
checkpoints, weight sync and tied embeddings are untouched) by an fp32 `F.linear` with autocast off, and the
module is marked so that the native runner, which reads `lm_head.weight` itself, does the same.
Cost: one upcast of the head weight per call (vocab × hidden) and an fp32 matmul for the last layer only.
"""

from __future__ import annotations

import types
from typing import TypeVar

import torch
import torch.nn.functional as F

M = TypeVar("M", bound=torch.nn.Module)

_MARK = "flywheel_fp32_logits"


def _fp32_forward(self, x: torch.Tensor) -> torch.Tensor:
    bias = None if self.bias is None else self.bias.float()
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.float(), self.weight.float(), bias)


def use_fp32_lm_head(model: M, enabled: bool = True) -> M:
    """Make `model.lm_head` compute its logits in float32 (or, with `enabled=False`, leave it alone)."""
    if not enabled:
        return model
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"numerics.fp32_lm_head needs a model whose `lm_head` is an nn.Linear, got "
                         f"{type(head).__name__}; set numerics.fp32_lm_head = false for this model")
    head.forward = types.MethodType(_fp32_forward, head)  # type: ignore[method-assign]  # this instance only
    setattr(head, _MARK, True)
    return model


def has_fp32_lm_head(head: torch.nn.Module) -> bool:
    return bool(getattr(head, _MARK, False))
