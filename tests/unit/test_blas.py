"""MKL's strict reproducible mode (modeling/blas.py): flywheel sets it on import, it makes every multiple of
16 rows give each row the same bits with two threads, and batch-invariant mode refuses a process without it."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from flywheel.modeling import blas

needs_mkl = pytest.mark.skipif(blas.mode() is None, reason="torch here has no MKL (another BLAS: nothing to pin)")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    child = {k: v for k, v in os.environ.items() if k != blas.ENV} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child, capture_output=True,
                          text=True, timeout=120)


@needs_mkl
def test_import_flywheel_sets_strict_mode_for_this_process_and_its_children():
    assert os.environ[blas.ENV] == blas.STRICT_MODE
    assert blas.mode() == blas.STRICT_MODE
    done = _python("import flywheel, os; from flywheel.modeling import blas; print(os.environ['MKL_CBWR'], blas.mode())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [blas.STRICT_MODE, blas.STRICT_MODE]


@needs_mkl
def test_two_threads_give_each_row_the_same_bits_for_every_multiple_of_16_rows():
    # The shapes of SmolLM2's projections and longer reductions: on an Intel Xeon (AVX-512, 2 threads) MKL's
    # default mode gives rows 64..192 of [M, 1536] @ [1536, 576] other bits than M = 16 (docs/numerics.md).
    done = _python("""
        import flywheel, torch, torch.nn.functional as F
        from flywheel.modeling.decoder import linear
        torch.manual_seed(0)
        assert torch.get_num_threads() == 2, torch.get_num_threads()
        for n, k in [(576, 1536), (576, 2048), (576, 3072), (1536, 1536), (960, 2560), (1536, 576), (192, 576)]:
            x, w = torch.randn(512, k), torch.randn(n, k)
            first = linear(x[:16], w)
            for m in range(16, 513, 16):
                assert torch.equal(linear(x[:m], w)[:16], first), (n, k, m)
            assert torch.equal(linear(x[:5], w), first[:5]), (n, k)  # padded to 16 rows
        print("ok")
    """, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@needs_mkl
def test_batch_invariant_mode_refuses_a_process_without_strict_mode():
    done = _python("""
        import flywheel
        from flywheel.config import ModelConfig
        from flywheel.modeling import blas
        from flywheel.modeling.decoder import DecoderRunner
        from flywheel.policy.model import build_model
        model = build_model(ModelConfig(preset="tiny", max_seq_len=128), vocab_size=64)
        DecoderRunner(model, 128)  # the default mode needs nothing
        print(blas.mode())
        try:
            DecoderRunner(model, 128, batch_invariant=True)
        except ValueError as e:
            print(e)
    """, MKL_CBWR="AUTO")
    assert done.returncode == 0, done.stderr
    mode, message = done.stdout.strip().split("\n", 1)
    assert mode == "AUTO"
    assert "MKL_CBWR=AUTO" in message and "MKL_CBWR=AUTO,STRICT" in message
    assert "numerics.batch_invariant = false" in message


def test_mode_is_none_or_an_mkl_name():
    current = blas.mode()
    assert current is None or current.split(",")[0] in blas._BRANCHES.values()
    if not torch.backends.mkl.is_available():
        assert current is None
