"""Trainer checkpoints: safetensors model + optimizer, RNG states, orchestrator state; atomic; no pickle.

    path = write_checkpoint(run_dir / "checkpoints", version, model_tensors, optimizer.state_dict(),
                            trainer_state={...}, extra_state={...})
    ckpt = read_checkpoint(latest_checkpoint(run_dir / "checkpoints"))

Layout of `checkpoints/step_00000012/`:

    model.safetensors      every state-dict tensor of the policy, bit-exact
    optimizer.safetensors  optimizer state tensors, keys "<param index>/<name>" (AdamW: step, exp_avg, exp_avg_sq)
    rng.safetensors        torch CPU (and CUDA) generator states
    state.json             version, trainer state (config, param groups, python/numpy RNG), orchestrator state

Why: a run that dies must resume to the very same bits (tests/unit/test_trainer.py checks it), and a
checkpoint half-written when the process dies must never be picked up. Everything is written into a
temporary sibling directory, fsynced, then renamed into place (atomic on POSIX); readers only look at
`step_*` names. Pickle-free formats mean a checkpoint from elsewhere cannot execute code on load.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_PREFIX = "step_"


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensor states, JSON states) of every RNG the trainer may touch."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    py = random.getstate()
    np_state: Any = np.random.get_state()  # the legacy tuple (its stub also allows a dict)
    meta = {"python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    py = meta["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = meta["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))


def _split_optimizer(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}/{name}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        pid, name = key.split("/", 1)
        state.setdefault(int(pid), {})[name] = value
    for pid, st in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(st)
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(root: str | Path, version: int, model_tensors: dict[str, torch.Tensor],
                     optimizer_state: dict[str, Any], trainer_state: dict[str, Any],
                     extra_state: dict[str, Any] | None = None) -> Path:
    """Write `root/step_<version>` atomically and return its path (an existing one is replaced)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        extra_json = json.dumps(extra_state or {})
    except TypeError as err:
        raise TypeError(f"orchestrator state for the checkpoint must be JSON-serialisable: {err}") from None
    final = root / f"{_PREFIX}{version:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model = {k: v.detach().contiguous().cpu() for k, v in model_tensors.items()}
    save_file(model, tmp / "model.safetensors")
    opt_tensors, opt_meta = _split_optimizer(optimizer_state)
    save_file(opt_tensors, tmp / "optimizer.safetensors")
    rng_tensors, rng_meta = capture_rng()
    save_file(rng_tensors, tmp / "rng.safetensors")
    state = {"version": version, "trainer": trainer_state, "optimizer": opt_meta, "rng": rng_meta,
             "extra": json.loads(extra_json)}
    (tmp / "state.json").write_text(json.dumps(state))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():
        old = root / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    _fsync_dir(root)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (keep <= 0 keeps all); returns what was deleted."""
    found = list_checkpoints(root)
    gone = found[:-keep] if keep > 0 else []
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """{"version", "model" (tensors), "optimizer" (a state dict), "rng" (tensors, meta), "trainer", "extra"}."""
    p = Path(path)
    if not (p / "state.json").is_file():
        raise ValueError(f"'{p}' is not a trainer checkpoint (no state.json); pass a checkpoints/step_* directory")
    state = json.loads((p / "state.json").read_text())
    return {
        "version": state["version"],
        "model": load_file(p / "model.safetensors"),
        "optimizer": _join_optimizer(load_file(p / "optimizer.safetensors"), state["optimizer"]),
        "rng": (load_file(p / "rng.safetensors"), state["rng"]),
        "trainer": state["trainer"],
        "extra": state["extra"],
    }


def export_model(base_model: str | Path, checkpoint: str | Path, out: str | Path) -> Path:
    """A loadable model directory at `out`: `base_model`'s config, tokenizer and chat template with `checkpoint`'s
    weights (a replaced `out`). A run stopped before its last step (a budget, a signal) writes no final_model
    (orchestrator/loop.py); this is how its last checkpoint gets evaluated or served."""
    from safetensors import safe_open

    with safe_open(str(Path(checkpoint) / "model.safetensors"), framework="pt") as f:
        if any(".lora_" in k for k in f.keys()):
            raise ValueError(f"{checkpoint} holds LoRA adapters only (trainer.lora): serve it on its base "
                             "(docs/training.md, LoRA) instead of exporting a model directory")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base_model, out)
    shutil.copyfile(Path(checkpoint) / "model.safetensors", out / "model.safetensors")
    return out
