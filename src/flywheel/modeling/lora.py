"""LoRA in a linear: merged into its weight or beside it, the formulas the engine serves and the trainer's exact
path computes.

    w = merge_lora(w0, a, b, scale)        # W0 [out, in] + scale * (B [out, r] @ A [r, in])
    w = linear_weight(module)              # what a (possibly peft-wrapped) nn.Linear computes with
    f = lora_factors(module)               # (A, B, scale) served unmerged, or None: y = x W^T + scale (x A^T) B^T

Why one function: batch-invariant mode promises that the engine's log-probs equal the trainer's bit for bit. The
engine applies an adapter by merging it into its weights (inference/local.py: from the pristine base W0 every
time, so swaps never drift), and the trainer's batch-invariant forward (modeling/batch_invariant.py) reads every
linear through `linear_weight`, which merges a peft LoRA layer's adapter with this same function. Same op order,
same dtype, same shapes: the same bits, and autograd still reaches A and B.

`linear_weight` knows peft's LoRA layer by its attributes (`base_layer`, `lora_A`, `lora_B`, `scaling`), so the
engine, which never holds a peft module, does not import peft.

Unmerged (`trainer.lora.serve = "unmerged"`): the base weights stay as they are and every adapted linear adds
`scale * (x A^T) B^T`, as peft's own forward does. The engine keeps the factors on its nn.Linear (`ATTACHED`,
inference/lora.py) and the trainer marks its peft layers (`UNMERGED`, trainer/lora.py); the decoder's one layer
(modeling/decoder.py) reads both through `lora_factors`, so the two still compute the same bits.
"""

from __future__ import annotations

import torch

ATTACHED = "_flywheel_lora"  # on an engine's nn.Linear: (A, B, scale) of the adapter it serves unmerged
UNMERGED = "_flywheel_lora_unmerged"  # on a trainer's peft LoRA layer: its adapter is served unmerged


def merge_lora(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """W0 + scale * (B @ A). w0 [out, in], a [r, in], b [out, r]; a new tensor in w0's dtype."""
    if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != tuple(w0.shape):
        raise ValueError(f"LoRA factors B {tuple(b.shape)} @ A {tuple(a.shape)} do not fit a weight of shape "
                         f"{tuple(w0.shape)}")
    return w0 + (b.to(w0.dtype) @ a.to(w0.dtype)) * float(scale)


def is_lora_layer(module) -> bool:
    """True for a peft LoRA layer wrapping an nn.Linear (it has `base_layer`, `lora_A` and `lora_B`)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")


def _active(module) -> str:
    active = [n for n in module.active_adapters if n in module.lora_A]
    if len(active) != 1:
        raise ValueError(f"a LoRA layer must have exactly one active adapter; it has {active}")
    return active[0]


def linear_weight(module) -> torch.Tensor:
    """The weight `module` multiplies by: its `.weight`, or for a peft LoRA layer its base weight with the active
    adapter merged (`merge_lora`), or without it when the adapter is served unmerged (`lora_factors`)."""
    if not is_lora_layer(module):
        return module.weight
    if getattr(module, UNMERGED, False):
        return module.base_layer.weight
    name = _active(module)
    return merge_lora(module.base_layer.weight, module.lora_A[name].weight, module.lora_B[name].weight,
                      module.scaling[name])


def lora_factors(module) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A [r, in], B [out, r], scale) of an adapter served beside the linear's weight, else None."""
    attached = getattr(module, ATTACHED, None)
    if attached is not None:
        return attached
    if is_lora_layer(module) and getattr(module, UNMERGED, False):
        name = _active(module)
        return module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])
    return None
