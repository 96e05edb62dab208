"""Engines by `inference.type`: a plain dict, and the one function the node and the evaluator call.

    engine, weights = build_node_engine(cfg, model_dir, tokenizer, store_url, log_dir, name="node0")
    await engine.start(); ...; weights.poll()          # `weights` has the Subscriber surface

Why here: the local engine needs the torch model in this process and a `Subscriber` that decodes weights for
it; the vLLM engine needs neither (the server loads the checkpoint, its workers pull the weights themselves),
so each type builds its own pair and the node stays blind to which one it got. Unknown types are refused
with the list of known ones (config validation refuses them first).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flywheel.config import FlywheelConfig
from flywheel.inference import local
from flywheel.inference.vllm import StoreSync, VLLMEngine
from flywheel.modeling.lm_head import use_fp32_lm_head
from flywheel.policy.model import load_model
from flywheel.weights.sync import Subscriber


def _local(cfg: FlywheelConfig, model_dir: Path, tokenizer, log_dir: Path, name: str):
    serve = cfg.model.dtype if cfg.inference.dtype == "model" else cfg.inference.dtype
    # loaded in the dtype it serves (from_pretrained keeps the rotary tables float32, a cast would not); weight
    # updates still arrive in the trainer's model.dtype and are rounded to it
    model = use_fp32_lm_head(load_model(model_dir, serve), cfg.numerics.fp32_lm_head)
    update_dtype = getattr(torch, cfg.model.dtype) if serve != cfg.model.dtype else None  # None: as served
    return local.build_engine(cfg.inference, model, tokenizer, cfg.numerics.batch_invariant, update_dtype=update_dtype)


def _vllm(cfg: FlywheelConfig, model_dir: Path, tokenizer, log_dir: Path, name: str):
    tokenizer_dir = None
    if tokenizer is not None and not (Path(model_dir) / "tokenizer.json").is_file():
        tokenizer_dir = Path(log_dir) / f"{name}-tokenizer"  # vLLM reads the tokenizer from a directory
        tokenizer.save_pretrained(str(tokenizer_dir))
    return VLLMEngine(cfg.inference, model_dir=model_dir, tokenizer_dir=tokenizer_dir, log_dir=log_dir,
                      max_seq_len=cfg.model.max_seq_len, name=name)


ENGINES: dict[str, Callable[..., Any]] = {"local": _local, "vllm": _vllm}


def build_engine(cfg: FlywheelConfig, model_dir: str | Path, tokenizer, log_dir: str | Path, name: str = "engine"):
    """The engine `cfg.inference.type` names, serving the checkpoint at `model_dir` (version 0)."""
    if cfg.inference.type not in ENGINES:
        raise ValueError(f"inference.type '{cfg.inference.type}' is not one of {sorted(ENGINES)}")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    return ENGINES[cfg.inference.type](cfg, Path(model_dir), tokenizer, Path(log_dir), name)


def build_node_engine(cfg: FlywheelConfig, model_dir: str | Path, tokenizer, store_url: str, log_dir: str | Path,
                      name: str = "engine"):
    """(engine, weight subscriber) for an inference node: the subscriber moves the engine to the store's newest
    version on `poll()` (local: weights.sync.Subscriber; vllm: inference.vllm.StoreSync)."""
    engine = build_engine(cfg, model_dir, tokenizer, log_dir, name)
    if cfg.inference.type == "vllm":
        return engine, StoreSync(store_url, engine, cfg.inference.vllm.weight_sync, cfg.weights)

    return engine, Subscriber.from_config(store_url, engine, cfg.weights)
