"""Weight-sync benchmark: `flywheel bench weights --out FILE [--quick] [--base runs/demo/base_model]`.
(`--model RUN_DIR`: the same codec figures on a finished real run's own versions, bench/weights_run.py.)

Codec, on the weights an engine really receives: every version the trainer publishes in two short RL runs
of the demo config (`configs/demo.toml`: its tasks and mid-trained base, built and cached by
`bench/pipeline.py` under runs/bench-pipeline/), one at the demo's own learning rate and one at lr 1e-6;
8 trainer steps each (4 with --quick), float32 as published and as bfloat16 casts. For consecutive
versions and a lag of 4: changed fraction, bytes per changed element, ratio to the raw tensors, and in the
same run the delta baselines zstd of old XOR new and zipnn of old XOR new (and zstd of the new weights
whole); encode/decode GB/s on one core (wall clock, and per second of the thread's CPU time, which a
shared machine disturbs less); bit-exactness. End to end (transport, on the 33 M `small` preset with bf16
snapshots of the Trainer on synthetic GRPO batches): publish -> an origin server -> one relay with a
bandwidth cap -> 1, 4, 16 subscriber processes, each installing into a real engine; latency from `publish`
to "engine serves it" (p50/p99) and the engine pause. The RL runs are reproduced by the bench itself; no
checkpoint is kept in the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import zstandard

from flywheel.bench.pipeline import base_policy, bench_config, bench_root
from flywheel.config import ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.orchestrator.loop import run_rl
from flywheel.policy.model import build_model
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, Segment, Trajectory
from flywheel.weights.relay import RelayServer
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher, Subscriber
from flywheel.weights.tensors import decode_tensor, encode_tensor, to_bits


def make_checkpoints(lr: float, num_warmup: int, num_versions: int, preset: str = "small",
                     batch: int = 4, seq: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """bf16 snapshots of flywheel's RL Trainer (AdamW, fp32 masters) stepping on GRPO batches of synthetic
    trajectories: groups of 2 sessions of random tokens, one rewarded, the second half sampled."""
    model = build_model(ModelConfig(preset=preset), vocab_size=2048)
    trainer = Trainer(model, TrainerConfig(lr=lr, weight_decay=0.0, batch_size=batch, correction="none",
                                           micro_batch_tokens=batch * seq))
    gen = torch.Generator().manual_seed(seed)
    half = seq // 2
    out = []
    for step in range(num_warmup + num_versions):
        batch_trajs = []
        for i in range(batch):
            ids = torch.randint(0, 2048, (seq,), generator=gen).tolist()
            seg = Segment(ids, [0] * half + [1] * (seq - half), [0.0] * half + [-7.6] * (seq - half),
                          [-1] * half + [step] * (seq - half))
            batch_trajs.append(Trajectory(task_id=f"t{i // 2}", group_id=f"s{step}g{i // 2}", segments=[seg],
                                          reward=Reward(float(i % 2))))
        trainer.step(batch_trajs)
        if step >= num_warmup:
            out.append({k: v.to(torch.bfloat16) for k, v in trainer.state_dict_for_publish().items()})
    return out


class UpTo:
    """A weight store seen as if `version` were its newest (a Subscriber installs the newest it sees)."""

    def __init__(self, store: Any, version: int):
        self.store, self.version = store, version

    def list_versions(self) -> list[int]:
        return [v for v in self.store.list_versions() if v <= self.version]

    def read_manifest(self, version: int) -> dict:
        return self.store.read_manifest(version)

    def get_chunk(self, cid: str) -> bytes:
        return self.store.get_chunk(cid)


def rl_checkpoints(quick: bool, lr: float | None, num_steps: int,
                   base_dir: str | None = None) -> list[dict[str, torch.Tensor]]:
    """Every version the trainer published in `num_steps` asynchronous RL steps of the demo config at `lr`
    (None: the demo's own), from the demo's mid-trained base (`base_dir`, e.g. a demo run's base_model, or
    built and cached by bench/pipeline.py), read back from the run's weight store."""
    _, base, tokenizer_dir, _, train, _ = base_policy(quick, base_dir)
    run_dir = bench_root(quick) / f"weights-lr{'demo' if lr is None else f'{lr:g}'}"
    store = WeightStore(str(run_dir / "weights"))
    if not (run_dir / "final_model").exists() or len(store.list_versions()) != num_steps + 1:
        shutil.rmtree(run_dir, ignore_errors=True)  # a finished run of this length is reused: delete it to redo
        settings = ["--weights.keep_versions", "1000"] + ([] if lr is None else ["--trainer.lr", str(lr)])
        cfg = bench_config(run_dir, "async", quick, "local", settings, num_steps=num_steps)
        run_rl(cfg, run_dir, base, tokenizer_dir, train)
        store = WeightStore(str(run_dir / "weights"))
    out = []
    for v in store.list_versions():
        sub = Subscriber(UpTo(store, v), num_threads=1)
        assert sub.poll() == v, f"could not read version {v} back from {store}"
        out.append({k: t.clone() for k, t in sub.tensors.items()})
        sub.close()
    return out


def flat_bits(sd: Mapping[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([to_bits(t) for t in sd.values()])


def codec_figures(old: np.ndarray, new: np.ndarray, chunk_bytes: int, zipnn_obj: Any) -> dict:
    enc_s = dec_s = enc_cpu_s = dec_cpu_s = float("inf")
    for _ in range(3):  # best of 3: the machine is shared, the first call pays page faults (and kernel loading)
        t0, c0 = time.perf_counter(), time.thread_time()
        blobs = encode_tensor(new, old, chunk_bytes, 3)
        enc_s, enc_cpu_s = min(enc_s, time.perf_counter() - t0), min(enc_cpu_s, time.thread_time() - c0)
        t0, c0 = time.perf_counter(), time.thread_time()
        out = decode_tensor(blobs, old, new.shape[0], new.dtype.itemsize, chunk_bytes // new.dtype.itemsize)
        dec_s, dec_cpu_s = min(dec_s, time.perf_counter() - t0), min(dec_cpu_s, time.thread_time() - c0)
    nbytes = sum(len(b) for b in blobs)
    changed = int(np.count_nonzero(new != old))
    xor = new ^ old
    z = zstandard.ZstdCompressor(level=3)
    r = {"changed_fraction": changed / new.shape[0], "bytes": nbytes,
         "bytes_per_changed": nbytes / max(changed, 1), "ratio": nbytes / new.nbytes,
         "zstd_new_ratio": len(z.compress(new.tobytes())) / new.nbytes,
         "zstd_xor_ratio": len(z.compress(xor.tobytes())) / new.nbytes,
         "encode_gbps": new.nbytes / enc_s / 1e9, "decode_gbps": new.nbytes / dec_s / 1e9,
         # per second of this thread's CPU time: the same work, minus time spent waiting for a shared core
         "encode_gbps_cpu": new.nbytes / enc_cpu_s / 1e9, "decode_gbps_cpu": new.nbytes / dec_cpu_s / 1e9,
         "bit_exact": bool(np.array_equal(out, new))}
    if zipnn_obj is not None:  # the same delta as zstd's: the XOR of the two versions' bits
        r["zipnn_xor_ratio"] = len(zipnn_obj.compress(xor.tobytes())) / new.nbytes
    return r


def median_of(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def zipnn_codec(dtype: str) -> Any:
    try:
        import zipnn  # optional: the baseline is reported when it is installed
    except ImportError:
        return None
    return zipnn.ZipNN(bytearray_dtype=dtype, threads=1)


def codec_bench(quick: bool, base_dir: str | None = None) -> dict:
    num_steps = 4 if quick else 8
    threads = torch.get_num_threads()
    results: dict[str, Any] = {}
    for run_name, lr in (("demo_rl", None), ("lr1e-6", 1e-6)):
        torch.set_num_threads(threads)
        snaps = rl_checkpoints(quick, lr, num_steps, base_dir)
        for dtype in ("float32", "bfloat16"):
            flat = [flat_bits({k: v.to(getattr(torch, dtype)) for k, v in s.items()}) for s in snaps]
            zobj = zipnn_codec(dtype)
            torch.set_num_threads(1)  # encode/decode on one core
            consec = [codec_figures(flat[i - 1], flat[i], 4 << 20, zobj) for i in range(1, len(flat))]
            lag4 = [codec_figures(flat[i - 4], flat[i], 4 << 20, zobj) for i in range(4, len(flat))]
            results[f"{run_name}_{dtype}"] = {
                "num_params": int(flat[0].shape[0]), "num_versions": len(flat), "consecutive": consec, "lag4": lag4,
                "median_consecutive": {k: median_of([c[k] for c in consec]) for k in consec[0] if k != "bit_exact"},
                "median_lag4": {k: median_of([c[k] for c in lag4]) for k in lag4[0] if k != "bit_exact"},
                "bit_exact": all(c["bit_exact"] for c in consec + lag4)}
    torch.set_num_threads(threads)
    return results


# ---------------------------------------------------------------- end to end

def _worker(url: str, preset: str) -> None:
    """Subscriber process: a real model behind a Subscriber; prints one JSON line per installed version."""
    torch.set_num_threads(1)
    model = build_model(ModelConfig(preset=preset, dtype="bfloat16"), vocab_size=2048)
    sub = Subscriber(url, LocalEngine(model), streams=8, num_threads=1)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        v = sub.poll()
        if v is not None:
            m = sub.metrics[-1]
            print(json.dumps({"version": v, "t": time.time(), "pause_ms": m["pause_ms"], "fetch_ms": m["fetch_ms"],
                              "apply_ms": m["apply_ms"], "path": m["path"], "bytes": m["bytes_fetched"]}), flush=True)
        else:
            time.sleep(0.02)


def e2e_bench(snaps: list[dict[str, torch.Tensor]], num_subs: int, preset: str, bandwidth_mbps: float) -> dict:
    d = tempfile.mkdtemp(prefix="fw-weights-")
    origin = RelayServer(store=d)
    relay = RelayServer(upstream=origin.start(), bandwidth_mbps=bandwidth_mbps, streams=8)
    url = relay.start()
    pub = Publisher(d, anchor_every=100, chunk_mb=1.0, num_threads=1)
    pub.publish(0, snaps[0]).result()
    procs = [subprocess.Popen([sys.executable, "-m", "flywheel.bench.weights", "worker", url, preset],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
             for _ in range(num_subs)]
    seen: dict[int, list[dict]] = {}
    lock = threading.Lock()

    def reader(p: subprocess.Popen) -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            rec = json.loads(line)
            if "version" in rec:
                with lock:
                    seen.setdefault(rec["version"], []).append(rec)

    threads = [threading.Thread(target=reader, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()

    def wait(v: int, timeout_s: float) -> None:
        end = time.time() + timeout_s
        while time.time() < end:
            with lock:
                if len(seen.get(v, [])) >= num_subs:
                    return
            time.sleep(0.01)
        raise TimeoutError(f"only {len(seen.get(v, []))}/{num_subs} subscribers reached v{v}")

    latencies, pauses, fetches = [], [], []
    try:
        wait(0, 300)
        for v in range(1, len(snaps)):
            t_pub = time.time()
            pub.publish(v, snaps[v])
            wait(v, 120)
            for rec in seen[v]:
                latencies.append((rec["t"] - t_pub) * 1e3)
                pauses.append(rec["pause_ms"])
                fetches.append(rec["fetch_ms"])
    finally:
        for p in procs:
            p.kill()
            p.wait()
        pub.close()
        relay.stop()
        origin.stop()
    return {"num_subscribers": num_subs, "bandwidth_mbps": bandwidth_mbps, "num_versions": len(snaps) - 1,
            "sync_ms_p50": float(np.percentile(latencies, 50)), "sync_ms_p99": float(np.percentile(latencies, 99)),
            "pause_ms_p50": float(np.percentile(pauses, 50)), "pause_ms_p99": float(np.percentile(pauses, 99)),
            "fetch_ms_p50": float(np.percentile(fetches, 50)), "relay_stats": relay.stats,
            "publisher": pub.metrics}


def run(args: Any) -> dict:
    if getattr(args, "model", None):  # a real run's versions (bench/weights_run.py)
        from flywheel.bench.weights_run import run as run_on_a_run
        return run_on_a_run(args)
    quick = bool(getattr(args, "quick", False))
    load_start = os.getloadavg()
    codec = codec_bench(quick, getattr(args, "base", None))
    preset = "tiny" if quick else "small"
    snaps = make_checkpoints(1e-6, num_warmup=3, num_versions=4, preset=preset)
    e2e, e2e_errors = {}, {}
    for n in [1, 2] if quick else [1, 4, 16]:
        try:
            e2e[n] = e2e_bench(snaps, n, preset, bandwidth_mbps=100.0)
        except TimeoutError as err:  # subscribers that cannot start on a loaded machine: keep the codec figures
            e2e_errors[str(n)] = str(err)
    top = max(e2e, default=0)
    summary: dict[str, Any] = {"num_params_rl": codec["demo_rl_float32"]["num_params"], "e2e_preset": preset}
    for name, c in codec.items():  # demo_rl / lr1e-6, float32 (as published) / bfloat16
        med, lag = c["median_consecutive"], c["median_lag4"]
        summary.update({f"ratio_{name}": med["ratio"], f"changed_fraction_{name}": med["changed_fraction"],
                        f"bytes_per_changed_{name}": med["bytes_per_changed"],
                        f"zstd_xor_ratio_{name}": med["zstd_xor_ratio"], f"zipnn_xor_ratio_{name}": med.get("zipnn_xor_ratio"),
                        f"zstd_new_ratio_{name}": med["zstd_new_ratio"], f"ratio_lag4_{name}": lag["ratio"]})
    summary.update({
        "encode_gbps_1core": median_of([c["median_consecutive"]["encode_gbps"] for c in codec.values()]),
        "decode_gbps_1core": median_of([c["median_consecutive"]["decode_gbps"] for c in codec.values()]),
        "encode_gbps_1core_cpu": median_of([c["median_consecutive"]["encode_gbps_cpu"] for c in codec.values()]),
        "decode_gbps_1core_cpu": median_of([c["median_consecutive"]["decode_gbps_cpu"] for c in codec.values()]),
        "bit_exact": all(v["bit_exact"] for v in codec.values()),
        **({"pause_ms_p50": e2e[top]["pause_ms_p50"], f"sync_ms_p99_{top}subs": e2e[top]["sync_ms_p99"]} if e2e else {}),
        **{f"sync_ms_p50_{n}subs": r["sync_ms_p50"] for n, r in e2e.items()},
        "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
        "e2e_errors": e2e_errors or None,
    })
    return {"summary": summary, "codec": codec, "e2e": {str(k): v for k, v in e2e.items()}, "e2e_errors": e2e_errors}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        _worker(sys.argv[2], sys.argv[3])
