"""Weight sync on a real run's versions: `flywheel bench weights --model RUN_DIR --out FILE`.

RUN_DIR is a finished RL run (e.g. `runs/real` after `make demo-real`: SmolLM2-135M-Instruct, its own learning
rate). Its weight store keeps the last `weights.keep_versions` published versions; every consecutive pair is
encoded with the delta codec, as published (the run's master dtype) and cast to bfloat16 (what a bf16 engine
receives), with the same run's baselines: zstd of old XOR new, zipnn of old XOR new where installed, zstd of the
new weights whole. Encode/decode GB/s on one core (wall clock and per second of the thread's CPU time); the
delta's size against the full model in that dtype; bit-exactness. Then the swap pause of the local engine: the
run's model serving 8 greedy requests while the next version's tensors are installed (bench/engine.py's timer).

Why a separate target from the synthetic one (bench/weights.py): a pretrained model's weights and a real run's
updates are what the codec's claims are about; the synthetic checkpoints only isolate the codec's mechanics.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from flywheel.bench.engine import swap_pause
from flywheel.bench.weights import UpTo, codec_figures, flat_bits, median_of, zipnn_codec
from flywheel.inference.local import LocalEngine
from flywheel.policy.model import load_model
from flywheel.types import SamplingParams
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Subscriber

CHUNK_BYTES = 4 << 20
TARGETS = {"bytes_per_changed_bfloat16": "<= 1.2", "delta_vs_full_bfloat16": "<= 0.05",
           "encode_gbps_1core": ">= 1", "decode_gbps_1core": ">= 2", "swap_pause_ms_local": "<= 50"}


def run_versions(run_dir: Path) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """(version, tensors) for every version the run's weight store still holds, oldest first."""
    store_dir = run_dir / "weights"
    if not store_dir.is_dir():
        raise ValueError(f"{run_dir} has no weights/ store; give the directory of a finished RL run "
                         "(e.g. runs/real after `make demo-real`)")
    store = WeightStore(str(store_dir))
    out = []
    for v in store.list_versions():
        sub = Subscriber(UpTo(store, v), num_threads=1)
        if sub.poll() != v:
            raise ValueError(f"could not read version {v} back from {store_dir}")
        out.append((v, {k: t.clone() for k, t in sub.tensors.items()}))
        sub.close()
    consecutive = sum(1 for (a, _), (b, _) in zip(out, out[1:]) if b == a + 1)
    if consecutive < 2:
        raise ValueError(f"{store_dir} holds {len(out)} versions with {consecutive} consecutive pairs; the bench "
                         "needs at least 2 (raise weights.keep_versions for the run)")
    return out


def _swap_pauses(model_dir: Path, versions: list[dict[str, torch.Tensor]], dtype: torch.dtype) -> dict[str, float]:
    model = load_model(model_dir, str(dtype).removeprefix("torch."))
    model.config.eos_token_id = None  # every request decodes all its tokens, so the swap lands mid-request
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None

    async def main():
        async with LocalEngine(model, max_batch_size=64) as engine:
            await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm-up
            rows = [await swap_pause(engine, {k: t.to(dtype) for k, t in new.items()}, 128, 512) for new in versions]
        return rows

    rows = asyncio.run(main())
    return {"swap_pause_ms_local": statistics.median(r[0] for r in rows),
            "swap_lock_held_ms_local": statistics.median(r[1] for r in rows),
            "decode_step_ms_local": statistics.median(r[2] for r in rows)}


def run(args: Any) -> dict:
    run_dir = Path(args.model)
    load_start = os.getloadavg()
    versions = run_versions(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    published = next(iter(versions[0][1].values())).dtype
    codec: dict[str, Any] = {}
    threads = torch.get_num_threads()
    for dtype in sorted({str(published).removeprefix("torch."), "bfloat16"}):
        flat = [(v, flat_bits({k: t.to(getattr(torch, dtype)) for k, t in sd.items()})) for v, sd in versions]
        zobj = zipnn_codec(dtype)
        torch.set_num_threads(1)  # encode/decode on one core
        pairs = [codec_figures(a, b, CHUNK_BYTES, zobj) | {"versions": [va, vb]}
                 for (va, a), (vb, b) in zip(flat, flat[1:]) if vb == va + 1]
        torch.set_num_threads(threads)
        keys = [k for k in pairs[0] if k not in ("bit_exact", "versions")]
        codec[dtype] = {"num_params": int(flat[0][1].shape[0]), "full_bytes": int(flat[0][1].nbytes),
                        "consecutive": pairs, "median": {k: median_of([p[k] for p in pairs]) for k in keys},
                        "bit_exact": all(p["bit_exact"] for p in pairs)}
    model_dir = run_dir / "final_model" if (run_dir / "final_model").is_dir() else run_dir / "base_model"
    swap = _swap_pauses(model_dir, [sd for _, sd in versions[1:4]], published)
    summary: dict[str, Any] = {"num_params": codec["bfloat16"]["num_params"],
                               "versions": [v for v, _ in versions], "published_dtype": str(published),
                               "run_lr": cfg.get("trainer", {}).get("lr")}
    for dtype, c in codec.items():
        m = c["median"]
        summary.update({f"bytes_per_changed_{dtype}": m["bytes_per_changed"],
                        f"changed_fraction_{dtype}": m["changed_fraction"],
                        f"delta_vs_full_{dtype}": m["ratio"], f"full_over_delta_{dtype}": 1 / m["ratio"],
                        f"zstd_xor_ratio_{dtype}": m["zstd_xor_ratio"], f"zipnn_xor_ratio_{dtype}": m.get("zipnn_xor_ratio"),
                        f"zstd_new_ratio_{dtype}": m["zstd_new_ratio"]})
    summary.update({
        "encode_gbps_1core": codec["bfloat16"]["median"]["encode_gbps"],
        "decode_gbps_1core": codec["bfloat16"]["median"]["decode_gbps"],
        "encode_gbps_1core_cpu": codec["bfloat16"]["median"]["encode_gbps_cpu"],
        "decode_gbps_1core_cpu": codec["bfloat16"]["median"]["decode_gbps_cpu"],
        "bit_exact": all(c["bit_exact"] for c in codec.values()), **swap,
        "targets": TARGETS, "load_avg_start": load_start, "load_avg_end": os.getloadavg()})
    return {"summary": summary, "codec": codec,
            "config": {"run_dir": str(run_dir), "engine_model": str(model_dir), "chunk_bytes": CHUNK_BYTES,
                       "model": cfg.get("model", {}).get("import_from") or cfg.get("model", {}).get("preset")}}
