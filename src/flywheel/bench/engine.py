"""Benchmark the local inference engine against Hugging Face on the `small` preset: `flywheel bench engine`.

    flywheel bench engine --out benchmarks/results/engine.json [--quick]
    flywheel bench engine --model models/smollm2 [--dtype bfloat16] --out FILE    # a real model (docs/models.md)
    flywheel bench engine --engines local,vllm,hf --out FILE    # local vs vLLM vs HF: bench/_engines.py

Everything in one run, greedy sampling for every contender, every system timed by wall clock on the same
requests after a warm-up: (a) agent workload: 64 sessions (seeded prompt lengths 50-500, output lengths
10-256 forced with max_new_tokens and no stop) arriving together; engine wall time vs HF `generate()` on the
same requests in static batches (left-padded, each batch waiting for its longest member) at each of several
batch sizes, the best of which is the headline baseline; (b) raw decode tokens/s at batch 1, 8, 32 of the
engine (default mode), HF `generate()` and a plain HF forward loop with its KV cache: batch x (N - 1) tokens over
the wall time of the N - 1 decode steps (generate() timed by a logits processor, the engine by its step log
from the end of the prefill step; prefill excluded alike), the contenders interleaved per repeat so that load from
other processes hits them alike, medians; (c) time to first token alone and under the workload, and the swap
pause: ms between the end of the last decode step on the old weights and the start of the first on the new.
The engine's decode thread is the only OpenMP team while it decodes (modeling/openmp.py), and each HF contender's
thread gives its OpenMP workers back after its run, so no contender is timed while another's idle team makes libgomp
throttle its spin-wait.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import threading
import time
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from flywheel.bench import _engines
from flywheel.config import ModelConfig
from flywheel.inference.local import LocalEngine
from flywheel.modeling import openmp
from flywheel.policy.model import build_model, load_model, num_parameters
from flywheel.types import SamplingParams

GREEDY: dict[str, Any] = {"temperature": 0.0}


def _requests(num, prompt_range, out_range, seed=0):
    rng = random.Random(seed)
    return [([rng.randrange(2048) for _ in range(rng.randint(*prompt_range))], rng.randint(*out_range))
            for _ in range(num)]


async def _engine_workload(engine, reqs):
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=n, **GREEDY)) for p, n in reqs))
    wall_s = time.perf_counter() - t0
    assert all(len(g.token_ids) == n for g, (_, n) in zip(gens, reqs))
    return wall_s, [g.ttft_s for g in gens]


def _decode_prompts(batch, prompt_len):
    return torch.randint(0, 2048, (batch, prompt_len), generator=torch.Generator().manual_seed(1))


@torch.inference_mode()
def _hf_forward_s(model, batch, prompt_len, num_tokens):
    """(num_tokens - 1 decode steps, their wall seconds) of a plain HF forward loop with its KV cache."""
    ids = _decode_prompts(batch, prompt_len)
    out = model(input_ids=ids, use_cache=True)
    past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(num_tokens - 1):
        out = model(input_ids=nxt, cache=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return num_tokens - 1, time.perf_counter() - t0


class _StepClock(LogitsProcessor):
    """Records when generate() reaches each token's logits (after the prefill, then after each decode step)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


@torch.inference_mode()
def _hf_generate_s(model, batch, prompt_len, num_tokens):
    """(num_tokens - 1 decode steps, their wall seconds) of generate(): from the first token's logits to the last's."""
    ids = _decode_prompts(batch, prompt_len)
    clock = _StepClock()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens,
                         min_new_tokens=num_tokens, do_sample=False, pad_token_id=0,
                         logits_processor=LogitsProcessorList([clock]))
    assert out.shape[1] == prompt_len + num_tokens and len(clock.times) == num_tokens
    return num_tokens - 1, clock.times[-1] - clock.times[0]


async def _in_thread(fn, *args):
    """`fn(*args)` (an HF contender) off the event loop, its thread's OpenMP workers given back after it, as the
    engine gives back its own when idle: a team left behind would throttle the next contender's (modeling/openmp.py)."""
    def call():
        try:
            return fn(*args)
        finally:
            openmp.release_team()
    return await asyncio.to_thread(call)


async def _engine_s(engine, batch, prompt_len, num_tokens):
    """(decode steps, their wall seconds) of the engine over the whole batch: from the end of the step that
    prefilled (and decoded once) the requests to the end of the last decode step, gaps between steps included."""
    ids = _decode_prompts(batch, prompt_len).tolist()
    engine.step_log.clear()
    engine.pause()  # queue the whole batch first, so that one step prefills all of it, as generate() does
    tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_new_tokens=num_tokens, **GREEDY)))
             for p in ids]
    await asyncio.sleep(0)  # each task runs up to its wait for the result: all are queued
    engine.resume()
    gens = await asyncio.gather(*tasks)
    assert all(len(g.token_ids) == num_tokens for g in gens)
    log = list(engine.step_log)
    assert log[0][4] == batch and all(s[3] == batch and s[4] == 0 for s in log[1:]), "not one batch throughout"
    return len(log) - 1, log[-1][1] - log[0][1]


async def _decode_rates(engine, model, batch, prompt_len, num_tokens, repeats) -> dict[str, float]:
    """Decode tokens/s of the engine, HF generate() and the HF forward loop at `batch`: batch x (N - 1) tokens
    over the wall time of the N - 1 decode steps (prefill excluded alike), each contender warmed up, the three
    interleaved per repeat so that load from other processes hits them alike; medians."""
    timers = {"engine": lambda n: _engine_s(engine, batch, prompt_len, n),
              "hf_generate": lambda n: _in_thread(_hf_generate_s, model, batch, prompt_len, n),
              "hf_forward": lambda n: _in_thread(_hf_forward_s, model, batch, prompt_len, n)}
    for timer in timers.values():  # warm-up: first calls at a new shape pay allocations and kernel selection
        await timer(4)
    rates: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, timer in timers.items():
            num_steps, wall_s = await timer(num_tokens)
            rates[name].append(batch * num_steps / wall_s)
    return {name: statistics.median(r) for name, r in rates.items()}


async def swap_pause(engine, new_weights, prompt_len, num_tokens):
    ids = torch.randint(0, 2048, (8, prompt_len), generator=torch.Generator().manual_seed(2)).tolist()
    engine.step_log.clear()
    old = engine.version
    tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_new_tokens=num_tokens, **GREEDY)))
             for p in ids]
    while len(engine.step_log) < num_tokens // 4:
        await asyncio.sleep(0.001)
    result: dict[str, float] = {}
    thread = threading.Thread(target=lambda: result.update(ms=engine.update_weights(old + 1, new_weights)))
    thread.start()
    await asyncio.to_thread(thread.join)
    gens = await asyncio.gather(*tasks)
    assert all(old in g.versions and old + 1 in g.versions for g in gens), \
        f"swap landed after the requests (steps: {[(v, n) for _, _, v, n, _ in list(engine.step_log)[:8]]}...)"
    log = list(engine.step_log)
    last_old = max(end for _, end, v, *_ in log if v == old)
    first_new = min(start for start, _, v, *_ in log if v == old + 1)
    step_ms = statistics.median(end - start for start, end, _, n, _ in log if n > 0) * 1000
    return (first_new - last_old) * 1000, result["ms"], step_ms


def run(args) -> dict:
    if getattr(args, "engines", None):
        return _engines.run(args)
    quick = bool(getattr(args, "quick", False))
    hf_batches: tuple[int, ...]
    if quick:
        num_sessions, prompt_range, out_range, hf_batches = 16, (20, 100), (5, 40), (4, 8, 16)
        decode_prompt, decode_tokens, repeats = 64, 12, 1
    else:
        num_sessions, prompt_range, out_range, hf_batches = 64, (50, 500), (10, 256), (8, 16, 32)
        decode_prompt, decode_tokens, repeats = 128, 64, 3
    model_dir = getattr(args, "model", None)
    if model_dir:  # prompts stay random ids below 2048, which every vocabulary holds
        model = load_model(model_dir, getattr(args, "dtype", None) or "bfloat16")
        model.config.max_position_embeddings = min(model.config.max_position_embeddings, 1024)
        model.config.eos_token_id = None  # every contender generates exactly max_new_tokens, as on the preset
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.eos_token_id = None
    else:
        model = build_model(ModelConfig(preset="small", max_seq_len=1024), vocab_size=2048)
    reqs = _requests(num_sessions, prompt_range, out_range)
    gen = torch.Generator().manual_seed(3)
    new_weights = {n: (p + 0.01 * torch.randn(p.shape, generator=gen)).to(p.dtype).contiguous()
                   for n, p in model.state_dict().items()}
    result: dict[str, Any] = {"config": {"preset": None if model_dir else "small", "model": model_dir,
                                         "model_type": model.config.model_type, "dtype": str(next(model.parameters()).dtype),
                                         "vocab_size": model.config.vocab_size, "num_parameters": num_parameters(model),
                         "num_sessions": num_sessions, "prompt_range": prompt_range, "out_range": out_range,
                         "hf_static_batches": hf_batches, "decode_prompt_len": decode_prompt,
                         "decode_tokens": decode_tokens, "repeats": repeats, "quick": quick,
                         "torch_threads": torch.get_num_threads(), "load_avg_start": os.getloadavg()}}

    async def main():
        eng, hf = {}, {}
        async with LocalEngine(model, max_batch_size=64) as engine:
            await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm-up
            await _engine_workload(engine, reqs[:8])
            walls, ttfts = [], []
            for _ in range(1 if not quick else repeats):  # the workload is long: once in the full run
                wall_s, ttft = await _engine_workload(engine, reqs)
                walls.append(wall_s)
                ttfts.extend(ttft)
            eng["workload_wall_s"] = statistics.median(walls)
            eng["workload_ttft_median_s"] = statistics.median(ttfts)
            eng["workload_ttft_p90_s"] = sorted(ttfts)[int(0.9 * len(ttfts))]
            # HF generate() on the same requests at each static batch size (warmed up on a short batch first)
            await _in_thread(_engines.hf_generate_wall_s, model, reqs[:2], 2)
            for b in hf_batches:
                hf[f"workload_wall_s_b{b}"] = await _in_thread(_engines.hf_generate_wall_s, model, reqs, b)
            for b in (1, 8, 32):
                rates = await _decode_rates(engine, model, b, decode_prompt, decode_tokens, repeats)
                eng[f"decode_b{b}_tok_s"] = rates["engine"]
                hf[f"generate_decode_b{b}_tok_s"] = rates["hf_generate"]
                hf[f"forward_decode_b{b}_tok_s"] = rates["hf_forward"]
            ttft_alone = []
            for i in range(max(3, repeats)):
                g = await engine.generate(_requests(1, (256, 256), (1, 1), seed=100 + i)[0][0],
                                          SamplingParams(max_new_tokens=1))
                ttft_alone.append(g.ttft_s)
            eng["ttft_alone_256_ms"] = statistics.median(ttft_alone) * 1000
            # last: the swaps change the model's weights
            swap_tokens = 4 * decode_tokens if not model_dir else max(4 * decode_tokens, 256)  # slower steps
            swaps = [await swap_pause(engine, new_weights, decode_prompt, swap_tokens)
                     for _ in range(max(3, repeats))]
            eng["swap_pause_ms"] = statistics.median(s[0] for s in swaps)
            eng["swap_lock_held_ms"] = statistics.median(s[1] for s in swaps)
            eng["swap_decode_step_ms"] = statistics.median(s[2] for s in swaps)
        return eng, hf

    eng, hf = asyncio.run(main())
    best_b = min(hf_batches, key=lambda b: hf[f"workload_wall_s_b{b}"])
    hf["workload_wall_s"], hf["workload_best_batch"] = hf[f"workload_wall_s_b{best_b}"], best_b
    result["engine"], result["hf"] = eng, hf
    result["summary"] = {
        "workload_speedup_vs_hf_generate_best": hf["workload_wall_s"] / eng["workload_wall_s"],
        "hf_generate_best_batch": best_b,
        **{f"decode_b{b}_vs_hf_generate": eng[f"decode_b{b}_tok_s"] / hf[f"generate_decode_b{b}_tok_s"]
           for b in (1, 8, 32)},
        "swap_pause_ms": eng["swap_pause_ms"],
        "engine_workload_wall_s": eng["workload_wall_s"],
        "hf_generate_workload_wall_s": hf["workload_wall_s"],
        "decode_tok_s": {f"b{b}": {"engine": eng[f"decode_b{b}_tok_s"], "hf_generate": hf[f"generate_decode_b{b}_tok_s"],
                                   "hf_forward": hf[f"forward_decode_b{b}_tok_s"]} for b in (1, 8, 32)},
        "ttft_alone_256_ms": eng["ttft_alone_256_ms"],
        "workload_ttft_median_s": eng["workload_ttft_median_s"],
        "load_avg_start": result["config"]["load_avg_start"], "load_avg_end": os.getloadavg(),
        "targets": {"workload_speedup_vs_hf_generate_best": ">= 2.5", "decode_b8_vs_hf_generate": ">= 1.0",
                    "decode_b32_vs_hf_generate": ">= 1.5", "swap_pause_ms": "<= 50"},
    }
    return result
