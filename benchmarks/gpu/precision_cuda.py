"""Low precision on a GPU: the mismatch table of `flywheel bench precision` with real fp8 matmuls, and tokens/s (issue 39)

    python benchmarks/gpu/precision_cuda.py --out precision_cuda.json               # needs a CUDA device; ~2-4 min
    python benchmarks/gpu/precision_cuda.py --model models/smollm2 --out FILE       # a real model instead of `small`

What it measures, per preset (default `small`, random init) or `--model DIR`, on one CUDA device:

* `fake_vs_real`: one [256, K] x [K, N] product through `torch._scaled_mm` (fp8 e4m3 operands, per-tensor scales,
  fp32 accumulate) against F.linear on the operands fake-quantized by flywheel (modeling/quant.py) in fp32: the
  max |Δ| relative to max |y|. The fake quantization is the numerics claim of docs/numerics.md ("Low precision");
  this checks it on the real kernel (only the accumulation order may differ: ~1e-6 expected).
* per (sampler, trainer) pair as in the CPU bench: 32 prompts of 64 random tokens, 32 tokens sampled at
  temperature 1 by the sampler (a bf16 copy of the fp32 master; full forward per step, no cache), then the
  trainer's log-probs of the same tokens (fp32 master weights under bf16 autocast; `fp8` = flywheel's
  trainer.matmul_precision fake quantization). Samplers: bf16; `fp8_real` (every decoder Linear a real fp8
  `_scaled_mm` with per-tensor scales, weights stored in fp8); `fp8` (fake-quantized weights, bf16 matmul);
  `mxfp4` and `nvfp4` (fake: fp4 matmuls need Blackwell, sm_100; on an H100/H200 they run dequantized).
  k3, max |Δ log p| and, from bench/precision.py's `corrections`, each correction's weight error and kept fraction.
* sampler forward tokens/s (batch 32 x 512 tokens, median of 5 after a warm-up) for bf16, fp8_real and the
  fake formats (which cost a bf16 matmul plus nothing: their weights were dequantized once).

It imports flywheel from the working tree (`src/`), so it runs on a bare GPU machine with torch and
transformers (pydantic, numpy, zstandard as the package needs them). Without CUDA it exits 2 with a message.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

E4M3_MAX = 448.0


class Fp8Linear(torch.nn.Module):
    """A Linear whose weight is stored in fp8 e4m3 (per-tensor scale) and whose input is quantized per call
    (current scaling): y = _scaled_mm(x_fp8, W_fp8^T) in fp32 accumulate, out in `out_dtype`. Rows padded to 16."""

    def __init__(self, lin: torch.nn.Linear, out_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.out_dtype = out_dtype
        w = lin.weight.detach().float()
        s = E4M3_MAX / w.abs().amax().double().clamp(min=1e-12)
        self.w_fp8 = (w * s.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # [N, K] row-major
        self.w_inv = (1.0 / s).float().reshape(()).to(w.device)
        self.bias = None if lin.bias is None else lin.bias.detach().to(out_dtype)
        self.out_features = lin.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        s = E4M3_MAX / x2.abs().amax().double().clamp(min=1e-12)
        xq = (x2 * s.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        m = xq.shape[0]
        pad = -m % 16
        if pad:
            xq = torch.cat([xq, xq.new_zeros(pad, xq.shape[1])])
        y = torch._scaled_mm(xq, self.w_fp8.t(), scale_a=(1.0 / s).float().reshape(()).to(x.device),
                             scale_b=self.w_inv, bias=self.bias, out_dtype=self.out_dtype)[:m]
        return y.reshape(*shape[:-1], self.out_features)


def _swap_fp8_real(model: torch.nn.Module) -> torch.nn.Module:
    from flywheel.trainer.precision import selected_linears

    for name, lin in selected_linears(model):
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], Fp8Linear(lin))
    return model


def fake_vs_real(device, k: int = 1024, n: int = 1024) -> dict:
    from flywheel.modeling.quant import fake_quant_fp8

    g = torch.Generator(device="cpu").manual_seed(0)
    x, w = torch.randn(256, k, generator=g).to(device), (torch.randn(n, k, generator=g) * 0.05).to(device)
    lin = torch.nn.Linear(k, n, bias=False).to(device)
    with torch.no_grad():
        lin.weight.copy_(w)
        real = Fp8Linear(lin, out_dtype=torch.float32)(x)
        fake = F.linear(fake_quant_fp8(x), fake_quant_fp8(w))
    return {"max_rel_diff": float((real - fake).abs().max() / fake.abs().max()), "k": k, "n": n}


def _sample(model, prompts: torch.Tensor, num_new: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens sampled at temperature 1 (full forward per step) and their log-probs under the sampler, [B, num_new]."""
    g = torch.Generator(device=prompts.device).manual_seed(seed)
    ids, lps = prompts, []
    with torch.no_grad():
        for _ in range(num_new):
            logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)
            tok = torch.multinomial(logp.exp(), 1, generator=g)
            lps.append(logp.gather(-1, tok))
            ids = torch.cat([ids, tok], 1)
    return ids, torch.cat(lps, 1)


def _trainer_logprobs(model, ids: torch.Tensor, num_new: int) -> torch.Tensor:
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits[:, -num_new - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -num_new:, None])[..., 0]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _tokens_per_s(model, vocab: int, device, batch: int = 32, seq: int = 512) -> float:
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    with torch.no_grad():
        model(input_ids=ids)
        times = []
        for _ in range(5):
            _sync(device)
            t0 = time.perf_counter()
            model(input_ids=ids)
            _sync(device)
            times.append(time.perf_counter() - t0)
    return batch * seq / statistics.median(times)


def measure(model, label: str, device, num_prompts: int = 32, num_new: int = 32) -> dict:
    from flywheel.bench.precision import corrections
    from flywheel.modeling.lm_head import use_fp32_lm_head
    from flywheel.modeling.quant import quantize_params_
    from flywheel.trainer.mismatch import mismatch_metrics
    from flywheel.trainer.precision import apply_matmul_precision

    vocab = int(model.config.vocab_size)
    master = use_fp32_lm_head(model.to(device).float().eval())
    bf16 = use_fp32_lm_head(copy.deepcopy(master).to(torch.bfloat16))
    samplers = {"bf16": bf16, "fp8_real": _swap_fp8_real(copy.deepcopy(bf16))}
    for fmt in ("fp8_e4m3", "mxfp4", "nvfp4"):
        m = copy.deepcopy(bf16)
        quantize_params_(dict(m.state_dict(keep_vars=True)), fmt)
        samplers["fp8" if fmt == "fp8_e4m3" else fmt] = m
    trainers = {"bf16": master, "fp8": apply_matmul_precision(copy.deepcopy(master), "fp8_tensor")}
    pairs = [("bf16", "bf16"), ("bf16", "fp8"), ("fp8_real", "bf16"), ("fp8", "bf16"), ("fp8_real", "fp8"),
             ("fp8", "fp8"), ("mxfp4", "bf16"), ("nvfp4", "bf16")]
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab, (num_prompts, 64), generator=g).to(device)
    rows = {}
    samples = {}
    for s_name, t_name in pairs:
        try:
            if s_name not in samples:
                samples[s_name] = _sample(samplers[s_name], prompts, num_new, seed=2)
            ids, lp_s = samples[s_name]
            lp_t = _trainer_logprobs(trainers[t_name], ids, num_new)
            mask = torch.ones_like(lp_t, dtype=torch.bool)
            mm = mismatch_metrics(lp_t.cpu(), lp_s.cpu(), mask.cpu())
            seq_ids = torch.arange(lp_t.shape[0])[:, None].expand_as(lp_t)
            rows[f"{s_name}/{t_name}"] = {"k3": mm["k3"], "max_abs_dlogp": mm["max_abs_diff"],
                                          "corrections": corrections(lp_t.double().cpu(), lp_s.double().cpu(),
                                                                     mask.cpu(), seq_ids)}
        except Exception as err:  # one failing configuration must not hide the others
            rows[f"{s_name}/{t_name}"] = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps({f"{s_name}/{t_name}": rows[f"{s_name}/{t_name}"]})[:400], flush=True)
    tps = {}
    for name, m in samplers.items():
        try:
            tps[name] = _tokens_per_s(m, vocab, device, *((4, 128) if device.type == "cpu" else (32, 512)))
        except Exception as err:
            tps[name] = f"{type(err).__name__}: {err}"
    return {"label": label, "pairs": rows, "sampler_tokens_per_s": tps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="precision_cuda.json")
    p.add_argument("--preset", default="small", help="model preset (random init, vocabulary 32000) when no --model "
                   "is given")
    p.add_argument("--model", default=None, metavar="DIR", help="a model directory (`flywheel models import`)")
    p.add_argument("--device", default="cuda", help="cuda (what this measures) or cpu (a smoke test: --preset tiny)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script measures real fp8 matmuls (torch._scaled_mm) on a GPU; on CPU run "
              "`flywheel bench precision` instead", file=sys.stderr)
        return 2
    from flywheel.config import ModelConfig
    from flywheel.policy.model import build_model, load_model

    cap = torch.cuda.get_device_capability(0) if device.type == "cuda" else (0, 0)
    result: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (smoke test)",
                    "capability": list(cap), "torch": torch.__version__,
                    "fp8_matmul": cap >= (8, 9) or device.type == "cpu", "fp4_matmul": cap >= (10, 0)}
    if not result["fp8_matmul"]:
        print(f"this GPU (sm_{cap[0]}{cap[1]}) has no fp8 matmul (needs sm_89+); fp8_real rows will fail",
              file=sys.stderr)
    result["fake_vs_real"] = fake_vs_real(device) if result["fp8_matmul"] else None
    print(json.dumps({"fake_vs_real": result["fake_vs_real"]}), flush=True)
    model = load_model(args.model, "float32") if args.model else build_model(ModelConfig(preset=args.preset,
                                                                                          max_seq_len=1024), 32_000)
    small = device.type == "cpu"  # the smoke test: a few short sessions
    result["run"] = measure(model, args.model or args.preset, device, *((4, 4) if small else (32, 32)))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
