"""The CPU BLAS's reduction order, pinned: MKL's strict conditional numerical reproducibility (CNR).

    from flywheel.modeling import blas
    blas.mode()             # 'AUTO,STRICT', 'AUTO' ... (MKL's current CNR mode), or None without MKL
    blas.require_strict()   # ValueError naming MKL_CBWR unless MKL reduces every output in one order

Why: with two or more threads MKL's sgemm splits the reduction dimension K between the threads for some
row counts and not for others. Measured on an Intel Xeon (AVX-512, MKL 2024.2, 2 threads):
[M, 1536] @ [1536, 576] (SmolLM2's down projection) gives the rows of M = 64 … 192 other bits than M = 16
or M >= 208, and [M, 2048] @ [2048, 576] differs from M = 16 for nearly every M >= 64. One thread showed no such
split, nor did the AMD EPYC host's 32-session batch-invariant run (max |Δ log p| 0.0 there).
Padding rows to a multiple of 16 (`decoder.ROW_TILE`) cannot fix that;
MKL's strict CNR mode (`MKL_CBWR=AUTO,STRICT`) can: it reduces in one order whatever the threads, and then
every multiple of 16 rows gives each row the same bits (`tests/unit/test_blas.py`). Its cost: SmolLM2's decode
within the noise of this machine, a float32 decode step at one row slower (docs/numerics.md).

MKL reads the mode once, at its first call, and refuses to change it later. So `import flywheel` sets
`MKL_CBWR=AUTO,STRICT` in the environment, unless it is already set (flywheel/__init__.py): child processes
(torchrun ranks, Ray workers, vLLM servers) inherit it. A process that ran a float32 matmul before importing
flywheel keeps MKL's default, and batch-invariant mode refuses to start there (`require_strict`).
"""

from __future__ import annotations

import ctypes
import functools
import os

ENV = "MKL_CBWR"
STRICT_MODE = "AUTO,STRICT"
_ALL = -1  # MKL_CBWR_ALL: ask for every setting (branch | strict bit)
_STRICT = 0x10000  # MKL_CBWR_STRICT
_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
             9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}


@functools.lru_cache(maxsize=1)
def _mkl_cbwr_get():
    """MKL's `mkl_cbwr_get`, from the MKL that torch links statically, or None where torch has no MKL."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return get


def mode() -> str | None:
    """MKL's conditional-numerical-reproducibility mode as MKL_CBWR spells it, or None where torch has no MKL
    (or hides its service functions). Asking fixes the mode: MKL reads MKL_CBWR at its first call."""
    get = _mkl_cbwr_get()
    if get is None:
        return None
    value = get(_ALL)
    if value < 0:
        return None
    branch = _BRANCHES.get(value & ~_STRICT, str(value & ~_STRICT))
    return f"{branch},STRICT" if value & _STRICT else branch


def require_strict(what: str = "numerics.batch_invariant") -> None:
    """ValueError unless MKL (where torch uses it) reduces each output in one order whatever the threads."""
    current = mode()
    if current is None or current.endswith(",STRICT"):
        return
    raise ValueError(
        f"{what} needs MKL's strict reproducible mode (with 2+ threads MKL otherwise splits some matmuls' "
        f"reductions by row count), but this process runs MKL_CBWR={current}. Import flywheel before anything "
        f"runs a float32 matmul (it sets {ENV}={STRICT_MODE}), or set {ENV}={STRICT_MODE} in the environment; "
        f"or set numerics.batch_invariant = false")
