"""Benchmark the engine's token sampling at a real vocabulary's size: `flywheel bench sampling`.

    flywheel bench sampling --model models/smollm2 --out benchmarks/results/sampling.json
    flywheel bench sampling --out FILE          # synthetic logits at V = 49,152 (SmolLM2's vocabulary)

What is timed: `inference/sampling.sample_token` on each row of a decode step (64 rows), at temperature 1
(the RL recipes' setting) and with top_p 0.95, against the implementation it replaced, in the same run with the
same timer after a warm-up, the two interleaved per repeat (medians of 5): `torch.multinomial` over the whole
vocabulary, and the nucleus by a sort of the whole vocabulary. The rows are the model's own next-token logits
at the last 16 positions of 4 random prompts (with --model), or Gaussian logits at three sharpnesses.
Each row is sampled alone, as the engine does (one row's float64 [V] fits in the L2 cache; docs/inference.md).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from flywheel.inference.sampling import sample_token

NUM_ROWS = 64
REPEATS = 5


def _baseline(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> tuple[int, float]:
    """The sampler before this one: nucleus by a full sort, the draw by torch.multinomial."""
    lp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = torch.sort(lp, descending=True)
        probs = sorted_lp.exp()
        keep_sorted = (torch.cumsum(probs, dim=0) - probs) < top_p
        keep_sorted[0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(0, order, keep_sorted)
        kept = lp.masked_fill(~keep, float("-inf"))
        lp = kept - torch.logsumexp(kept, dim=-1)
    token = int(torch.multinomial(lp.exp(), 1, generator=generator))
    return token, float(lp[token])


def _rows(args, vocab_size: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    model_dir = getattr(args, "model", None)
    if model_dir:
        from flywheel.policy.model import load_model

        model = load_model(model_dir, getattr(args, "dtype", None) or "bfloat16")
        ids = torch.randint(100, min(int(model.config.vocab_size), 40_000), (4, 48),
                            generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            logits = model(ids).logits[:, -NUM_ROWS // 4:].reshape(NUM_ROWS, -1).float()
        return {"model": logits}, {"model": model_dir, "vocab_size": int(logits.shape[-1])}
    g = torch.Generator().manual_seed(0)
    return ({f"gaussian_x{s}": torch.randn(NUM_ROWS, vocab_size, generator=g) * s for s in (2, 5, 10)},
            {"model": None, "vocab_size": vocab_size})


def _time_rows(fn, rows: torch.Tensor, temperature: float, top_p: float) -> float:
    g = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    for row in rows:
        fn(row, temperature, top_p, g)
    return (time.perf_counter() - t0) / rows.shape[0] * 1e6


def run(args) -> dict:
    sets, config = _rows(args, 49_152)
    config.update({"num_rows": NUM_ROWS, "repeats": REPEATS, "torch_threads": torch.get_num_threads()})
    figures: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for name, rows in sets.items():
        for label, (temperature, top_p) in {"t1": (1.0, 1.0), "t1_top_p95": (1.0, 0.95)}.items():
            for fn in (sample_token, _baseline):  # warm-up
                _time_rows(fn, rows[:4], temperature, top_p)
            new, old = [], []
            for _ in range(REPEATS):
                new.append(_time_rows(sample_token, rows, temperature, top_p))
                old.append(_time_rows(_baseline, rows, temperature, top_p))
            key = f"{name}_{label}"
            figures[key] = {"row_us": statistics.median(new), "baseline_row_us": statistics.median(old),
                            "step_ms_64_rows": statistics.median(new) * NUM_ROWS / 1e3,
                            "baseline_step_ms_64_rows": statistics.median(old) * NUM_ROWS / 1e3}
            summary[f"speedup_{key}"] = statistics.median(old) / statistics.median(new)
    return {"config": config, "figures": figures, "summary": summary}
