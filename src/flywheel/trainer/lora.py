"""LoRA on the trainer's model (peft): inject adapters, name their tensors, publish, checkpoint, merge back.

    model = apply_lora(model, cfg.trainer.lora)       # in place; base frozen, only lora_A / lora_B train
    adapter = adapter_tensors(model)                  # {"model.layers.0.self_attn.q_proj.lora_A": [r, in], ...}
    meta = adapter_meta(model, cfg.trainer.lora)      # the manifest's marker: rank, scale, base digest
    merge_and_unload(model)                           # back to plain nn.Linear with W0 + scale * B @ A (mid-training)

Why peft's `inject_adapter_in_model` and not `get_peft_model`: the model keeps its own class and its top-level
names (`model.layers...`, `lm_head`), so the trainer, FSDP's per-layer wrapping (trainer/distributed.py), the
batch-invariant forward (which reads a LoRA layer merged: modeling/lora.py) and the engines see the same module
tree as without LoRA; only the targeted nn.Linear become peft LoRA layers (`base_layer`, `lora_A`, `lora_B`).

The published adapter uses plain names: `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r] where `<module>`
is the nn.Linear's name in the un-wrapped model, so an engine that never imports peft maps them onto its own
linears (inference/local.py `update_adapter`). `base_digest` names the base weights the adapter belongs to
(`weights/tensors.state_digest` over the base model's state dict under its plain names), so an engine serving other
base weights refuses the adapter instead of serving a policy nobody trained.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import inject_adapter_in_model

from flywheel.config import LoraConfig
from flywheel.config.base import ConfigError
from flywheel.modeling.lora import UNMERGED, is_lora_layer, merge_lora
from flywheel.weights.tensors import state_digest

ADAPTER = "default"  # peft's adapter name; one adapter per model
SUFFIX_A, SUFFIX_B = ".lora_A", ".lora_B"


def has_lora(model: torch.nn.Module) -> bool:
    return any(is_lora_layer(m) for m in model.modules())


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """The peft LoRA layers by their module name (which is also the plain nn.Linear's name)."""
    return {name: m for name, m in model.named_modules() if is_lora_layer(m)}


def plain_name(state_name: str) -> str:
    """A wrapped model's state-dict name under the un-wrapped model (`q_proj.base_layer.weight` -> `q_proj.weight`)."""
    return state_name.replace(".base_layer.", ".")


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, seed: int = 0) -> torch.nn.Module:
    """Inject rank-`cfg.rank` adapters into the linears whose names end with a `cfg.target_modules` entry, freeze
    everything else; returns the model (changed in place). A model that already has adapters is returned as is.

    B starts at zero (the adapted model is the base), A as peft draws it (Kaiming-uniform) but from a generator
    seeded with `seed`, module by module in name order: every rank of a sharded trainer, and a single process,
    start from the same adapter whatever their global RNG state."""
    if cfg.rank <= 0:
        raise ValueError("apply_lora needs trainer.lora.rank > 0")
    if has_lora(model):
        return model
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    matched = [n for n in names if any(n == t or n.endswith("." + t) for t in cfg.target_modules)]
    if not matched:
        suffixes = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ConfigError(f"trainer.lora.target_modules {cfg.target_modules} match no nn.Linear of this model; its "
                          f"linears end with {suffixes[:12]}")
    alpha: Any = cfg.alpha  # peft annotates an int; a float works (its scaling is lora_alpha / r)
    pcfg = PeftLoraConfig(r=cfg.rank, lora_alpha=alpha, lora_dropout=cfg.dropout, bias="none",
                          target_modules=list(cfg.target_modules))
    inject_adapter_in_model(pcfg, model, adapter_name=ADAPTER)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in sorted(lora_layers(model).items()):
            a = m.lora_A[ADAPTER].weight
            a.copy_(torch.nn.init.kaiming_uniform_(torch.empty(a.shape), a=math.sqrt(5), generator=gen))
            m.lora_B[ADAPTER].weight.zero_()
            setattr(m, UNMERGED, cfg.serve == "unmerged")  # the exact path computes as the engines serve
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return model


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The adapter's parameters by their state-dict names (the wrapped model's)."""
    return {n: p for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the adapter under plain names: `<module>.lora_A` [r, in], `<module>.lora_B` [out, r].
    Sharded: every rank calls it (a DTensor's full tensor is a collective)."""
    out: dict[str, torch.Tensor] = {}
    for name, m in lora_layers(model).items():
        for suffix, factors in ((SUFFIX_A, m.lora_A), (SUFFIX_B, m.lora_B)):
            w = factors[ADAPTER].weight
            full = w.full_tensor() if hasattr(w, "full_tensor") else w
            out[name + suffix] = full.detach().to("cpu", copy=True).contiguous()
    return out


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's tensors under plain names (the adapter left out): what an engine without LoRA holds."""
    return {plain_name(n): t for n, t in model.state_dict().items() if ".lora_A." not in n and ".lora_B." not in n}


def base_digest(model: torch.nn.Module) -> str:
    """`state_digest` of the base weights (one pass over every byte; the trainer computes it once)."""
    state = {}
    for n, t in base_state(model).items():
        state[n] = t.full_tensor() if hasattr(t, "full_tensor") else t
    return state_digest(state)


def adapter_meta(model: torch.nn.Module, cfg: LoraConfig, digest: str) -> dict[str, Any]:
    """The manifest's adapter marker (weights/sync.py): what the tensors are and which base they belong to."""
    return {"rank": cfg.rank, "alpha": cfg.alpha, "scale": cfg.scale, "base_digest": digest,
            "modules": sorted(lora_layers(model)), "serve": cfg.serve}


def merge_and_unload(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every adapter into its base weight (`merge_lora`, the engine's formula) and put the plain nn.Linear
    back in place of the LoRA layer; returns the model, changed in place, with every parameter trainable again."""
    for name, m in list(lora_layers(model).items()):
        base = m.base_layer
        with torch.no_grad():
            base.weight.copy_(merge_lora(base.weight, m.lora_A[ADAPTER].weight, m.lora_B[ADAPTER].weight,
                                         m.scaling[ADAPTER]))
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, base)
    for p in model.parameters():
        p.requires_grad_(True)
    if hasattr(model, "peft_config"):  # set by inject_adapter_in_model
        del model.peft_config
    return model
