"""`flywheel serve` on vLLM, the logic without a server: the targeted weight sync a deploy follower drives, and the
settings `Service.build` refuses before it starts anything.

    .venv/bin/python -m pytest -q tests/unit/test_serve_vllm_logic.py

The store is a real one on disk; the engine is a stand-in that records what `StoreSync` asks of it (the real
server's side is tests/integration/test_online_vllm.py).
"""

from __future__ import annotations

import pytest
import torch

from flywheel.config import load_config
from flywheel.inference.vllm import StoreSync, VLLMError
from flywheel.online.service import Service
from flywheel.weights.sync import Publisher


class RecordingEngine:
    """What StoreSync needs of a VLLMEngine: `version` and `sync_weights`; fails on demand."""

    def __init__(self) -> None:
        self.version = 0
        self.calls: list[tuple[int, bool]] = []
        self.fail = False

    def sync_weights(self, version: int, store_url: str, *, exact: bool = False) -> dict:
        self.calls.append((version, exact))
        if self.fail:
            raise VLLMError("vLLM /collective_rpc answered 500: boom")
        self.version = version
        return {"version": version, "pause_ms": 1.5}


@pytest.fixture
def store(tmp_path):
    url = str(tmp_path / "weights")
    with Publisher(url, anchor_every=10, num_threads=1) as pub:
        for v in range(4):
            pub.publish(v, {"w": torch.full((4, 4), float(v))}).result()
    return url


def test_a_target_installs_exactly_that_version_older_ones_included(store):
    eng = RecordingEngine()
    sync = StoreSync(store, eng)  # type: ignore[arg-type]
    assert sync.poll(2) == 2 and eng.calls == [(2, True)]
    assert sync.poll(1) == 1 and eng.calls[-1] == (1, True)  # a rollback goes back
    assert sync.poll(1) is None and len(eng.calls) == 2  # already serving it: nothing to do
    assert sync.poll(9) is None and "version 9 is not in the store" in str(sync.last_error)
    assert len(eng.calls) == 2 and eng.version == 1
    assert sync.poll() == 3 and eng.calls[-1] == (3, False)  # untargeted (the RL loop): the newest
    assert [m["version"] for m in sync.metrics] == [2, 1, 3] and sync.metrics[-1]["pause_ms"] == 1.5


def test_a_failed_install_is_reported_and_leaves_the_version(store):
    eng = RecordingEngine()
    eng.fail = True
    sync = StoreSync(store, eng)  # type: ignore[arg-type]
    assert sync.poll(2) is None and eng.version == 0 and "boom" in str(sync.last_error)
    eng.fail = False
    assert sync.poll(2) == 2 and sync.last_error is None


def test_serve_refuses_what_vllm_cannot_do_naming_the_key(tmp_path):
    base = [f"--run_dir={tmp_path}", "--inference.type=vllm"]
    with pytest.raises(ValueError, match=r"online.pool.rollouts = false"):
        Service.build(load_config(None, [*base, "--online.pool.rollouts=true"]))
    with pytest.raises(ValueError, match=r"model.dtype = 'bfloat16' but inference.vllm.dtype = 'float32'"):
        Service.build(load_config(None, [*base, "--model.dtype=bfloat16"]))
    assert not list(tmp_path.iterdir())  # refused before anything was written
