"""Does the batch-invariant forward stay bit-identical across batch compositions on a GPU? (issue 6, measured once)

    python benchmarks/gpu/numerics_cuda.py --out results.json      # needs a CUDA device; ~1-2 minutes

On CPU the batch-invariant mode is exact by construction (one BLAS kernel family per padded row count). A GPU
is where batch variance really bites: cuBLAS picks its kernel (tile shape, split-K) by problem size, so the
same row can be reduced in another order when the batch around it changes. This script measures, for the
`small` (dense) and `tiny-moe` presets on the GPU (the batch-invariant forward computes in fp32, like the
engine in that mode; bf16 is measured for the default forward only):

* modes: `default` (the HF forward), `batch_invariant` (flywheel's, fixed [128, K] row tiles on CUDA),
  `batch_invariant_pad8` (the CPU rule, rows padded to a multiple of 8) and `batch_invariant_bmm` (fixed
  tiles as one batched matmul) — the last two are the designs the measurement ruled out;
* max |Δ log p| of every token between each sequence scored alone and scored inside batches of 4 and 16
  (right-padded, mixed lengths), for the HF forward (default mode) and for `BatchInvariantForward`;
* forward throughput (tokens/s) of both at batch 16, and the cost of the batch-invariant forward.

It imports flywheel from the working tree (`src/`), so it runs on a bare GPU machine with torch and
transformers; pydantic and zstandard come from wheels if missing (see docs/numerics.md for how it was run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402


def _batches(lengths: list[int], vocab: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g) for n in lengths]


def _pad(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def _score(mode: str, model, fwd, seqs: list[torch.Tensor], device) -> list[torch.Tensor]:
    from flywheel.policy.logprobs import logprobs_from_logits

    ids, mask = _pad(seqs)
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        logits = fwd(ids)[0] if mode.startswith("batch_invariant") else model(input_ids=ids, attention_mask=mask,
                                                                    use_cache=False).logits
    lp = logprobs_from_logits(logits[:, :-1], ids[:, 1:])
    return [lp[i, : len(s) - 1].float().cpu() for i, s in enumerate(seqs)]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _throughput(mode: str, model, fwd, seqs, device, repeats: int = 5) -> float:
    ids, mask = _pad(seqs)
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        for _ in range(2):
            fwd(ids) if mode.startswith("batch_invariant") else model(input_ids=ids, attention_mask=mask, use_cache=False)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            fwd(ids) if mode.startswith("batch_invariant") else model(input_ids=ids, attention_mask=mask, use_cache=False)
        _sync(device)
    return repeats * int(mask.sum()) / (time.perf_counter() - t0)


def bmm_linear(tile: int):
    """Fixed [tile, K] row tiles as one batched matmul ([chunks, tile, K] @ [K, N]): one launch, if cuBLAS keeps
    the same kernel whatever the number of chunks (that is what this measures)."""

    def linear(x, weight, bias=None):
        n = x.shape[0]
        pad = (-n) % tile
        if pad:
            x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
        out = torch.matmul(x.view(-1, tile, x.shape[1]), weight.t()).reshape(-1, weight.shape[0])
        if bias is not None:
            out = out + bias
        return out[:n]

    return linear


def pad8_linear(x, weight, bias=None):
    """The CPU rule on any device: rows padded to a multiple of 8, one matmul (not invariant under cuBLAS)."""
    import torch.nn.functional as F

    n = x.shape[0]
    pad = (-n) % 8
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    return F.linear(x, weight, bias)[:n]


def measure(preset: str, dtype: str, device) -> dict:
    from flywheel.config import ModelConfig
    from flywheel.modeling.batch_invariant import BatchInvariantForward
    from flywheel.policy.model import build_model

    model = build_model(ModelConfig(preset=preset, dtype=dtype, max_seq_len=1024), vocab_size=2048).to(device).eval()
    modes = ("default", "batch_invariant", "batch_invariant_pad8", "batch_invariant_bmm") \
        if dtype == "float32" else ("default",)
    fwd = BatchInvariantForward(model, max_seq_len=1024) if "batch_invariant" in modes else None
    lengths = [64 + (37 * i) % 448 for i in range(16)]
    seqs = _batches(lengths, 2048, seed=1)
    out: dict = {"preset": preset, "dtype": dtype, "lengths": lengths}
    import flywheel.modeling.batch_invariant as bi
    import flywheel.modeling.decoder as qwen3

    original = qwen3.linear
    for mode in modes:
        patched = {"batch_invariant_pad8": pad8_linear, "batch_invariant_bmm": bmm_linear(128)}.get(mode, original)
        qwen3.linear = bi.linear = patched
        alone = [_score(mode, model, fwd, [s], device)[0] for s in seqs]
        worst = 0.0
        for size in (4, 16):
            for start in range(0, len(seqs), size):
                group = _score(mode, model, fwd, seqs[start:start + size], device)
                for a, b in zip(alone[start:start + size], group):
                    worst = max(worst, float((a - b).abs().max()))
        out[f"{mode}_max_abs_dlogp"] = worst
        out[f"{mode}_tokens_per_s_b16"] = _throughput(mode, model, fwd, seqs, device)
    qwen3.linear = bi.linear = original
    if fwd is not None:
        for m in ("batch_invariant_pad8", "batch_invariant_bmm"):
            out[f"{m}_cost"] = 1 - out[f"{m}_tokens_per_s_b16"] / out["default_tokens_per_s_b16"]
        out["batch_invariant_cost"] = 1 - out["batch_invariant_tokens_per_s_b16"] / out["default_tokens_per_s_b16"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="numerics_cuda.json")
    p.add_argument("--device", default="cuda", help="cuda (what this measures) or cpu (a smoke test)")
    p.add_argument("--presets", default="small,tiny-moe")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: TF32 would hide the question
    torch.backends.cudnn.allow_tf32 = False
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; this script measures GPU numerics (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    result: dict = {"device": name, "torch": torch.__version__, "runs": []}
    for preset in args.presets.split(","):
        for dtype in ("bfloat16", "float32"):
            try:
                r = measure(preset, dtype, device)
            except Exception as err:  # one failing configuration must not hide the others
                r = {"preset": preset, "dtype": dtype, "error": f"{type(err).__name__}: {err}"}
            result["runs"].append(r)
            print(json.dumps(r), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
