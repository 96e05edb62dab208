"""The decoder families the native runner reproduces exactly, as a plain registry.

    family, why_not = native_family(model, max_seq_len)    # (Family, "") or (None, "the reason, for a log line")

Why a registry and not one class per family: Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE are one decoder (RMSNorm,
rotary attention with grouped KV heads, a gated MLP or routed experts) that differ in a few flags: a bias on the
q/k/v projections (Qwen2; Llama with `attention_bias`), RMSNorm on each head's queries and keys (Qwen3), biases
on the MLP (Llama with `mlp_bias`), routed experts (Qwen3-MoE), a tied or untied head. The runner
(modeling/decoder.py) reads those from the HF module's own parameters, so one forward serves them all, as vLLM
maps Mistral onto its Llama model. The rotary tables come from the HF module's `inv_freq` and
`attention_scaling`, which already hold the Llama-3, YaRN, linear and LongRoPE variants; only rope that changes
with the sequence length ("dynamic") is refused.

What sends a model to the HF fallback (modeling/hf_runner.py), with the reason logged: a model type outside the
registry, sliding-window attention narrower than the context (full attention is the same thing when the window
covers it), dynamic rope.
Tests: tests/unit/test_families.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    qk_norm: bool = False  # RMSNorm over each head's q and k before rotary (Qwen3)
    moe: bool = False  # routed experts in the MLP (Qwen3-MoE)
    window_attr: str | None = None  # the config's sliding-window size, when the family has one


FAMILIES: dict[str, Family] = {
    "llama": Family("llama"),
    "mistral": Family("mistral", window_attr="sliding_window"),
    "qwen2": Family("qwen2", window_attr="sliding_window"),
    "qwen3": Family("qwen3", qk_norm=True, window_attr="sliding_window"),
    "qwen3_moe": Family("qwen3_moe", qk_norm=True, moe=True, window_attr="sliding_window"),
}
STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn", "longrope"})


def _window(cfg, family: Family) -> int | None:
    """The sliding window the HF model applies, or None when it attends to the whole context."""
    if family.window_attr is None:
        return None
    if family.name.startswith("qwen") and not getattr(cfg, "use_sliding_window", False):
        return None  # Qwen configs carry a window size that applies only with use_sliding_window
    window = getattr(cfg, family.window_attr, None)
    return int(window) if window else None


def native_family(model, max_seq_len: int) -> tuple[Family | None, str]:
    """The model's family when the native runner reproduces it for contexts up to `max_seq_len`, else (None,
    why not)."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    family = FAMILIES.get(model_type or "")
    if family is None:
        return None, f"model_type {model_type!r} is not in the native registry ({', '.join(FAMILIES)})"
    window = _window(cfg, family)
    if window is not None and window < max_seq_len:
        return None, f"sliding-window attention ({window} tokens) narrower than the context ({max_seq_len})"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default") if rotary is not None else None
    if rope_type not in STATIC_ROPE:
        return None, f"rope type {rope_type!r} changes with the sequence length"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return None, "no decoder layers at model.model.layers"
    if family.qk_norm != hasattr(layers[0].self_attn, "q_norm"):
        return None, f"{model_type} layers without the expected q/k norms"
    return family, ""
