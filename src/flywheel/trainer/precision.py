"""trainer.matmul_precision: fp8 matmuls in the trainer's forward, as fake quantization with straight-through grads.

    apply_matmul_precision(model, "fp8_tensor")   # once, on the model the Trainer owns (trainer/train.py does it)
    model(input_ids=ids)                          # every decoder nn.Linear now multiplies fp8 e4m3 operands

Why: an fp8 trainer (torchao's float8 training, current/dynamic scaling) rounds the input and the weight of
every Linear to fp8 e4m3 before the matmul; the sampler never sees the same rounding, so its log-probs drift
from the trainer's. On CPU the same operands come from quantize-dequantize (modeling/quant.py), and the matmul
runs in the trainer's dtype. How: each selected module's `forward` is replaced on the instance by
`F.linear(q(x), q(W), b)`, where `q` is an autograd Function whose backward passes the gradient through
unchanged (straight-through), so the fp32 master weights and AdamW's state are what they were, and a weight
delta, a checkpoint or a state dict sees no difference. The backward's matmuls stay in high precision
(torchao's recipe would also round grad_output to e5m2: not done).

- "bf16": nothing changes (trainer.dtype as it is).
- "fp8_tensor": one scale per tensor (the input's scale over the whole micro-batch, as torchao's tensorwise).
- "fp8_block": one scale per 128 values of the last dim (DeepSeek-V3's 1 x 128 tiles; for the weight
  [out, in] the blocks run along `in`).
Selected: every nn.Linear except the LM head (numerics.fp32_lm_head keeps it fp32) and MoE routers
(`mlp.gate`), as torchao's float8 recipes in torchtitan skip the output projection and routers. Delayed
scaling (scales from an amax history) is not built: torchao dropped it; current scaling is its recipe.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from flywheel.modeling.quant import FP8_BLOCK, fake_quant_fp8

PRECISIONS = ("bf16", "fp8_tensor", "fp8_block")
_MARK = "_flywheel_matmul_precision"


class _FakeQuantSTE(torch.autograd.Function):
    """Forward: x through fp8 e4m3 (per tensor, or per `block` values). Backward: the gradient unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, block: int | None) -> torch.Tensor:
        return fake_quant_fp8(x, torch.float8_e4m3fn, block_size=block)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block: int | None) -> torch.Tensor:
    """F.linear on fp8 e4m3 operands (fake-quantized with straight-through gradients)."""
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):  # operands in the autocast dtype first
        dtype = torch.get_autocast_dtype("cuda" if x.is_cuda else "cpu")
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    return F.linear(_FakeQuantSTE.apply(x, block), _FakeQuantSTE.apply(weight, block), bias)


def _fp8_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return fp8_linear(x, self.weight, self.bias, FP8_BLOCK if getattr(self, _MARK) == "fp8_block" else None)


def selected_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The nn.Linear modules whose matmuls go fp8: all but the LM head and MoE routers."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and not n.endswith("lm_head") and not n.endswith("mlp.gate")]


def apply_matmul_precision(model: torch.nn.Module, precision: str, batch_invariant: bool = False) -> torch.nn.Module:
    """Switch the model's Linear forwards to `precision` (in place; returns the model). ValueError for an
    unknown name, for a second, different precision on the same model, and with batch-invariant mode (its
    forward reads the weights directly, not through the modules)."""
    if precision not in PRECISIONS:
        raise ValueError(f"trainer.matmul_precision must be one of {list(PRECISIONS)}, got '{precision}'")
    if precision == "bf16":
        return model
    if batch_invariant:
        raise ValueError(f"trainer.matmul_precision = '{precision}' rounds the HF forward's matmuls; the "
                         "batch-invariant forward does not go through them: set numerics.batch_invariant = false "
                         "or trainer.matmul_precision = 'bf16'")
    for _, module in selected_linears(model):
        done = getattr(module, _MARK, None)
        if done is not None:
            if done != precision:
                raise ValueError(f"this model's linears already run '{done}', not '{precision}'")
            continue
        # a bound method: copy.deepcopy of the model binds the copy's forward to the copy's own weights
        module.forward = types.MethodType(_fp8_forward, module)  # type: ignore[method-assign]
        setattr(module, _MARK, precision)
    return model


def matmul_precision_of(model: torch.nn.Module) -> str:
    """The precision `apply_matmul_precision` set on the model's linears ("bf16" if none)."""
    for _, module in selected_linears(model):
        return getattr(module, _MARK, "bf16")
    return "bf16"
