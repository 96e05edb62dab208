"""`flywheel serve` on vLLM, the logic without a server: the targeted weight sync a deploy follower drives, the
undo of a failed apply, and the settings `Service.build` refuses before it starts anything.

    .venv/bin/python -m pytest -q tests/unit/test_serve_vllm_logic.py

The store is a real one on disk; the engine is a stand-in that records what `StoreSync` asks of it, and the vLLM
server one that records the engine's calls in order (the real server's side is tests/integration/test_online_vllm.py).
"""

from __future__ import annotations

import pytest
import torch

from flywheel.config import InferenceConfig, load_config
from flywheel.inference.vllm import StoreSync, VLLMEngine, VLLMError
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


def test_a_failed_apply_is_undone_before_generation_resumes():
    """The worker may have repacked some layers with the new version when its apply fails: while still paused, the
    engine reloads the checkpoint and re-installs the version it serves, then resumes and reports the error."""
    calls: list[tuple] = []
    eng = VLLMEngine(InferenceConfig(type="vllm", vllm={"url": "http://127.0.0.1:9"}), model_dir="/ckpt")

    def post(path: str, body: dict | None = None, timeout_s: float = 600.0) -> dict:
        method = (body or {}).get("method")
        calls.append((path, method, *(body or {}).get("args", [])) if method else
                     (path, *(body or {}).values()))
        if method == "flywheel_apply" and body and body["args"] == ["3"]:
            raise VLLMError("vLLM /collective_rpc answered 500: 2 live tensors differ from the verified ones")
        version = int(body["args"][1]) if method == "flywheel_prepare" else 0
        return {"results": [{"version": version}]}

    eng._post = post  # type: ignore[method-assign]
    eng.sync_weights(2, "/store", exact=True)
    calls.clear()
    with pytest.raises(VLLMError, match="differ"):
        eng.sync_weights(3, "/store", exact=True)
    assert calls == [("/collective_rpc", "flywheel_prepare", "/store", "3", "1"), ("/pause?mode=keep",),
                     ("/collective_rpc", "flywheel_apply", "3"),
                     ("/collective_rpc", "flywheel_reload", "/ckpt", "0"), ("/update_weight_version", "0"),
                     ("/collective_rpc", "flywheel_prepare", "/store", "2", "1"),
                     ("/collective_rpc", "flywheel_apply", "2"), ("/update_weight_version", "2"), ("/resume",)]
    assert eng.version == 2
