"""`flywheel bench engine --engines local,vllm,hf`: one agent workload on each engine, and vLLM's weight updates.

    flywheel bench engine --engines local,vllm,hf --out benchmarks/results/engines.json [--quick]

The same seeded requests (greedy, each forced to its output length) go to flywheel's local engine, to a vLLM
server that flywheel launches (inference.vllm defaults: .venv-vllm, float32) and to HF `generate()` in static
batches; tokens/s = generated tokens / wall time. Then, on the `tiny` preset (`--preset small`: 32 M parameters),
random init:

* `*_trainer_k3`, `*_trainer_max_abs_dlogp`: sampled at temperature 1, the engine's log-probs vs the trainer's
  recomputation (HF forward, float32) of the same tokens on the same weights;
* `vllm_update_s_delta`: `Publisher.publish` of an RL-like change (5 % of the entries of every tensor moved)
  until vLLM has resumed on it through the store (worker extension: prepare, pause, in-place apply, resume);
  `vllm_update_s_full`: the plain path, the checkpoint saved and reloaded whole by vLLM; one timer in this
  process, the trainer side on one torch thread, medians over 5 updates (7 without --quick) after a warm-up
  update; `vllm_update_delta_stages_ms` / `vllm_update_full_stages_ms`: the median of each stage (publish's
  snapshot, encode and writes; the worker's fetch, decode + verify, apply, read-back; the full path's save and
  reload); `--preset small` for the 32 M-parameter model;
* `vllm_swap_pause_ms`: how long generation is held during a delta update, from sending `/pause?mode=keep`
  to `/resume` answering (an upper bound of the gap between the last token on the old weights and the first
  on the new, measured on the client);
* the delta path must give the weights of the full reload, at every update: the hashes of the tensors vLLM keeps
  as plain parameters, read back live, equal the manifest's, and greedy outputs and log-probs (one request at a
  time) after the delta update equal those after the full reload, which covers the weights a CPU build keeps
  only packed (asserted).
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from flywheel.config import InferenceConfig, ModelConfig
from flywheel.inference.local import LocalEngine
from flywheel.inference.vllm import VLLMEngine
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model, num_parameters, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.types import SamplingParams
from flywheel.weights.sync import Publisher


def _requests(num, prompt_range, out_range, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        n_p = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=g))
        n_o = int(torch.randint(out_range[0], out_range[1] + 1, (1,), generator=g))
        out.append((torch.randint(1, 2048, (n_p,), generator=g).tolist(), n_o))
    return out


async def _workload(engine, reqs, forced: bool):
    extra = (lambda n: {"extra_params": {"min_tokens": n}}) if forced else (lambda n: {})
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=0.0, max_new_tokens=n), **extra(n))
                                  for p, n in reqs))
    wall = time.perf_counter() - t0
    num = sum(len(g.token_ids) for g in gens)
    assert num == sum(n for _, n in reqs), "a request ended early"
    return num / wall


@torch.inference_mode()
def hf_generate_wall_s(model, reqs, batch_size):
    """Wall seconds of HF `generate()` over `reqs` ([(prompt ids, new tokens)]) in left-padded static batches."""
    t0 = time.perf_counter()
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        n = max(n for _, n in batch)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
        assert out.shape[1] == width + n
    return time.perf_counter() - t0


async def _mismatch(engine, model, prompts):
    gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=32, seed=i))
                                  for i, p in enumerate(prompts)))
    d = []
    with torch.no_grad():
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + g.token_ids], device=next(model.parameters()).device)
            lp = token_logprobs(model, ids)[0, len(p) - 1:].float().cpu()
            d += (lp - torch.tensor(g.logprobs)).tolist()
    t = torch.tensor(d, dtype=torch.float64)
    return float((torch.exp(t) - t - 1).mean()), float(t.abs().max()), len(d)


def _perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < 0.05
            p.add_(mask * torch.randn(p.shape, generator=g) * 0.05 * p.float().std().clamp_min(1e-3))


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    engines = [e for e in str(args.engines).split(",") if e]
    unknown = set(engines) - {"local", "vllm", "hf"}
    if unknown:
        raise ValueError(f"--engines: unknown {sorted(unknown)}; choose from local, vllm, hf")
    num, prange, orange, repeats = (16, (20, 100), (8, 48), 2) if quick else (32, (50, 300), (16, 128), 3)
    preset, dtype = getattr(args, "preset", None) or "tiny", getattr(args, "dtype", None) or "float32"
    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-engines-"))
    tok = train_tokenizer(default_corpus(300_000), 2048)
    model = build_model(ModelConfig(preset=preset, max_seq_len=1024, dtype=dtype), len(tok),
                        eos_token_id=tok.eos_token_id)
    save_model(model, root / "v0")
    save_tokenizer(tok, root / "v0")
    reqs = _requests(num, prange, orange)
    prompts = [p for p, _ in _requests(8, (16, 64), (1, 1), seed=9)]
    res = {"config": {"preset": preset, "num_parameters": num_parameters(model), "num_sessions": num,
                      "prompt_range": prange, "out_range": orange, "repeats": repeats, "quick": quick,
                      "dtype": dtype, "engines": engines}}
    summary: dict = {}

    async def local_part():
        async with LocalEngine(copy.deepcopy(model), max_batch_size=64) as eng:
            await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            rates = [await _workload(eng, reqs, forced=False) for _ in range(repeats)]
            k3, mx, n = await _mismatch(eng, model, prompts)
        return statistics.median(rates), k3, mx, n

    if "local" in engines:
        rate, k3, mx, n = asyncio.run(local_part())
        summary.update(local_tokens_per_s=rate, local_trainer_k3=k3, local_trainer_max_abs_dlogp=mx)
    if "hf" in engines:
        summary["hf_tokens_per_s"] = statistics.median(sum(n for _, n in reqs) / hf_generate_wall_s(model, reqs, 16)
                                                        for _ in range(repeats))
    if "vllm" in engines:
        summary.update(_vllm_part(model, root, reqs, prompts, repeats, res, getattr(args, "vllm", None) or {}))
    summary["targets"] = {"vllm_swap_pause_ms": "<= 100", "vllm_update_s_delta": "<= 0.5 x vllm_update_s_full"}
    res["summary"] = summary
    return res


def _vllm_part(model, root: Path, reqs, prompts, repeats, res, vllm: dict) -> dict:
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    cfg = InferenceConfig(type="vllm", max_batch_size=64, vllm={"num_threads": 1, "dtype": dtype, **vllm})
    eng = VLLMEngine(cfg, model_dir=root / "v0", log_dir=root, max_seq_len=1024)
    out: dict = {}
    try:
        t0 = time.perf_counter()
        eng.start_sync()
        res["vllm_start_s"] = time.perf_counter() - t0

        async def serve():
            await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # warm-up (~15 s the first time)
            rates = [await _workload(eng, reqs, forced=True) for _ in range(repeats)]
            return statistics.median(rates), await _mismatch(eng, model, prompts)

        rate, (k3, mx, n) = asyncio.run(serve())
        out.update(vllm_tokens_per_s=rate, vllm_trainer_k3=k3, vllm_trainer_max_abs_dlogp=mx)
        out.update(_updates(eng, model, root, prompts, updates=5 if repeats <= 2 else 7))
        res["vllm_update_log"] = eng.update_log
    finally:
        eng.close()
    return out


def _updates(eng, model, root: Path, prompts, updates: int) -> dict:
    """`updates` + 1 versions (the first is a warm-up), each by the delta path and then by a full reload, timed
    from the trainer's publish until the server has resumed on it (its next engine step uses the new weights);
    the trainer side on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core machine a 2-thread copy waits on OpenMP's barrier (up to 0.7 s)
    try:
        store = str(root / "weights")
        pub = Publisher(store, anchor_every=1000, num_threads=1)
        pub.publish(0, model.state_dict()).result()
        live = copy.deepcopy(model)
        eng.sync_weights(0, store)  # the worker takes the anchor once; every later version is a delta
        rows = []
        for v in range(1, updates + 2):
            _perturb(live, v)
            t0 = time.perf_counter()
            published = pub.publish(v, live.state_dict()).result()
            t1 = time.perf_counter()
            m = eng.sync_weights(v, store)
            delta_s = time.perf_counter() - t0
            assert m["path"] == "delta", m
            hashes = eng.weight_hashes()  # the tensors vLLM keeps as plain parameters, read back live
            manifest = pub.store.read_manifest(v)["tensors"]
            assert hashes and all(manifest[k]["hash"] == h for k, h in hashes.items()), "delta path: hash mismatch"
            after_delta = asyncio.run(_greedy(eng, prompts))
            t2 = time.perf_counter()
            save_model(live, root / f"v{v}")
            t3 = time.perf_counter()
            r = eng.reload_weights(v, root / f"v{v}")
            full_s = time.perf_counter() - t2
            # packed (oneDNN) weights cannot be read back: the delta path must behave exactly as the reload
            assert asyncio.run(_greedy(eng, prompts)) == after_delta, "delta path differs from a full reload"
            eng.sync_weights(v, store)  # the worker re-reads its anchor route after a reload
            rows.append({"delta_s": delta_s, "full_s": full_s, "num_hashed_live": len(hashes), "delta": {
                "publish_ms": (t1 - t0) * 1e3, **{f"publish_{k}": published[k] for k in ("snapshot_ms", "encode_ms",
                                                                                      "write_ms")},
                "sync_ms": m["total_ms"], "prepare_ms": m["prepare_ms"], "pause_ms": m["pause_ms"],
                **{f"worker_{k}": x for k, x in m["worker"].items()}},
                "full": {"save_ms": (t3 - t2) * 1e3, "pause_ms": r["pause_ms"], "worker_reload_ms": r["worker"]["reload_ms"]},
                "bytes_delta": m["bytes_fetched"],
                "bytes_full": sum(f.stat().st_size for f in (root / f"v{v}").glob("*.safetensors"))})
            shutil.rmtree(root / f"v{v}", ignore_errors=True)
        pub.close()
    finally:
        torch.set_num_threads(threads)
    timed = rows[1:]

    def med(part: str) -> dict:
        return {k: statistics.median(r[part][k] for r in timed) for k in timed[0][part]}

    return {"vllm_update_s_delta": statistics.median(r["delta_s"] for r in timed),
            "vllm_update_s_full": statistics.median(r["full_s"] for r in timed),
            "vllm_swap_pause_ms": statistics.median(r["delta"]["pause_ms"] for r in timed),
            "vllm_delta_bit_identical": True, "vllm_delta_verified": "live sha256 of the plain parameters ("
            f"{timed[0]['num_hashed_live']} tensors); packed linear weights: greedy tokens and log-probs equal a full reload's",
            "vllm_update_s_delta_first": rows[0]["delta_s"], "vllm_update_s_full_first": rows[0]["full_s"],
            "vllm_update_num_timed": len(timed), "vllm_update_delta_stages_ms": med("delta"),
            "vllm_update_full_stages_ms": med("full"),
            "vllm_update_bytes_delta": statistics.median(r["bytes_delta"] for r in timed),
            "vllm_update_bytes_full": statistics.median(r["bytes_full"] for r in timed)}


async def _greedy(eng, prompts):
    """Greedy tokens and log-probs, one request at a time: sent together, how vLLM batches them depends on when
    each arrives, and a float32 batch of another shape may differ in the last bit."""
    gens = [await eng.generate(p, SamplingParams(temperature=0.0, max_new_tokens=16), extra_params={"min_tokens": 16})
            for p in prompts]
    return [(g.token_ids, g.logprobs) for g in gens]
