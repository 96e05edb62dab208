"""The vLLM engine's checks on a GPU with the CUDA `vllm` package (issue 24; prepared, not a test dependency).

    python benchmarks/gpu/vllm_cuda.py --out vllm_cuda.json [--preset small] [--dtype bfloat16]

Runs `flywheel bench engine --engines local,vllm,hf` (flywheel/bench/_engines.py) with the server launched
from this Python (`inference.vllm.python = sys.executable`: install the CUDA `vllm` >= 0.32 here) and without
the CPU-only settings: the same agent workload on the three engines (tokens/s), engine vs trainer log-probs
(k3, max |Δ log p|), the delta update against a full reload (`vllm_update_s_delta`, `vllm_update_s_full`,
`vllm_swap_pause_ms`), and the assertion that the delta path gives the weights of the full reload (on GPUs the
linear weights are plain parameters, so every tensor is read back and hash-checked in place).

It imports flywheel from the working tree (`src/`); flywheel's own dependencies (pydantic, zstandard, numba,
fsspec, safetensors, aiohttp) must be importable next to vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from flywheel.bench import _engines  # noqa: E402
from flywheel.bench._machine import machine_info  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="vllm_cuda.json")
    p.add_argument("--preset", default="small", choices=["tiny", "small"])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--engines", default="local,vllm,hf")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    args = types.SimpleNamespace(engines=a.engines, quick=a.quick, preset=a.preset, dtype=a.dtype,
                                 vllm={"python": sys.executable, "enforce_eager": False, "num_threads": 0,
                                       "gpu_memory_utilization": 0.5})
    result = _engines.run(args)
    result["machine"] = machine_info()
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
