"""The policy: build a Hugging Face causal LM from a preset, or load any one from a local directory.

    from flywheel.policy.model import build_model, load_model, save_model
    model = build_model(ModelConfig(preset="tiny"), vocab_size=2048)
    save_model(model, "runs/x/model"); again = load_model("runs/x/model")   # bit-exact round trip

Why presets: nothing is downloaded at run time, so tests, the demo and benchmarks build Qwen3-style
models from config with seeded random initialisation. `path` loads any `AutoModelForCausalLM`
checkpoint (safetensors) instead, so the same code serves a real model on a GPU cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from flywheel.config import ModelConfig, UserError

# Architectures per preset. Sizes are parameter counts at vocab 2048 (the demo tokenizer).
PRESETS: dict[str, dict[str, Any]] = {
    # ~2.0 M parameters: tests, fast on two CPU cores. The demo runs it 2 layers deep (1.2 M; model.num_layers).
    "tiny": dict(model_type="qwen3", hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    # ~33 M parameters: benchmarks (weight sync, engine throughput).
    "small": dict(model_type="qwen3", hidden_size=512, intermediate_size=1536, num_hidden_layers=10,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True),
    # ~2.3 M parameters, 8 experts, top-2 routing: MoE numerics and router replay.
    "tiny-moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=384, moe_intermediate_size=128,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                     tie_word_embeddings=True, router_aux_loss_coef=0.0),
    # ~2 M parameters each: the other families of the native registry (modeling/families.py), for its tests.
    # Llama with an untied head and biases on attention and MLP; Qwen2 with its q/k/v bias; Mistral.
    "tiny-llama": dict(model_type="llama", hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                       attention_bias=True, mlp_bias=True),
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-mistral": dict(model_type="mistral", hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                         sliding_window=None),
}

hf_logging.disable_progress_bar()  # shard/weight-loading bars would drown our own progress output

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def preset_config(name: str, vocab_size: int, max_seq_len: int = 2048, num_layers: int = 0,
                  **special_tokens: int | None):
    """The transformers config of a preset, `num_layers` deep (0 = the preset's depth); `special_tokens` are
    e.g. `eos_token_id=..., pad_token_id=...`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset '{name}'; choose one of {sorted(PRESETS)} or set model.path")
    spec = dict(PRESETS[name])
    if num_layers:  # depth only: every matrix keeps its shape, so kernels and batch-invariance tiles are the same
        spec["num_hidden_layers"] = num_layers
    model_type = spec.pop("model_type")
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, max_position_embeddings=max_seq_len,
                                rms_norm_eps=1e-6, rope_theta=10000.0, attention_dropout=0.0,
                                use_cache=True, **spec, **{k: v for k, v in special_tokens.items() if v is not None})


def build_model(cfg: ModelConfig, vocab_size: int, **special_tokens: int | None) -> PreTrainedModel:
    """A model from `cfg`: loaded from `cfg.path` when set, else a preset with seeded random init."""
    if cfg.path:
        return load_model(cfg.path, cfg.dtype)
    if cfg.preset is None:
        raise ValueError("set model.preset (tiny, small, tiny-moe) or model.path (a local HF checkpoint dir)")
    hf_config = preset_config(cfg.preset, vocab_size, cfg.max_seq_len, cfg.num_layers, **special_tokens)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=_DTYPES[cfg.dtype])
    model.eval()
    return model


def load_model(path: str | Path, dtype: str = "float32") -> PreTrainedModel:
    """Load a local HF causal-LM checkpoint directory; never reaches the network."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"model directory '{p}' has no config.json; point model.path at a saved HF checkpoint")
    if dtype not in _DTYPES:
        raise ValueError(f"model dtype '{dtype}' is not one of {sorted(_DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(p, dtype=_DTYPES[dtype], local_files_only=True)
    model.eval()
    return model


def save_model(model: torch.nn.Module, path: str | Path) -> Path:
    """Save as safetensors + config.json (a directory `load_model` and any HF tool can read)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"save_model takes a transformers model, got {type(model).__name__}")
    model.save_pretrained(p, safe_serialization=True)
    return p


def num_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())


def is_moe(model: PreTrainedModel) -> bool:
    return getattr(model.config, "num_experts", 0) > 0 or getattr(model.config, "num_local_experts", 0) > 0
