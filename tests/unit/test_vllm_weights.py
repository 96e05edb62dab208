"""Where Hugging Face tensors land in vLLM's fused parameters (inference/vllm_worker.py `WeightMap`).

    .venv/bin/python -m pytest -q tests/unit/test_vllm_weights.py

A stand-in module with vLLM's layout (fused qkv_proj / gate_up_proj, an embedding padded to 64 rows, a tied
lm_head) stands for the vLLM model: the logic under test is the placement, the real server is in
tests/integration/test_vllm.py.
"""

import pytest
import torch

from flywheel.inference.vllm_worker import WeightMap, live_hash
from flywheel.weights.tensors import bits_hash, to_bits


class FakeVLLMQwen3(torch.nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"tie_word_embeddings": True})()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens.weight = torch.nn.Parameter(torch.zeros(64, 8))  # vocab 50 padded to 64
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = torch.nn.Linear(8, 12 + 4 + 4, bias=False)
        layer.mlp = torch.nn.Module()
        layer.mlp.gate_up_proj = torch.nn.Linear(8, 2 * 16, bias=False)
        self.model.layers = torch.nn.ModuleList([layer])


def hf_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (50, 8), "lm_head.weight": (50, 8),
              "model.layers.0.self_attn.q_proj.weight": (12, 8), "model.layers.0.self_attn.k_proj.weight": (4, 8),
              "model.layers.0.self_attn.v_proj.weight": (4, 8), "model.layers.0.mlp.gate_proj.weight": (16, 8),
              "model.layers.0.mlp.up_proj.weight": (16, 8)}
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def test_each_tensor_lands_in_its_rows_of_the_fused_parameter():
    model, ts = FakeVLLMQwen3(), hf_tensors()
    wmap = WeightMap(model, {n: tuple(t.shape) for n, t in ts.items()})
    for n, t in ts.items():
        wmap.check(n, t.dtype, tuple(t.shape))
        wmap.view(n).copy_(t)
    qkv = model.model.layers[0].self_attn.qkv_proj.weight.data
    assert torch.equal(qkv[0:12], ts["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(qkv[12:16], ts["model.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(qkv[16:20], ts["model.layers.0.self_attn.v_proj.weight"])
    gu = model.model.layers[0].mlp.gate_up_proj.weight.data
    assert torch.equal(gu[16:], ts["model.layers.0.mlp.up_proj.weight"])
    assert wmap.slots["lm_head.weight"] == ("model.embed_tokens.weight", 0, 50)  # tied: the embedding itself
    assert torch.equal(model.model.embed_tokens.weight.data[50:], torch.zeros(14, 8))  # padding untouched
    for n, t in ts.items():  # read back through the map, the manifest's hash (raw bytes) holds
        assert live_hash(wmap.view(n)) == bits_hash(to_bits(t))


def test_refuses_what_does_not_fit():
    model, ts = FakeVLLMQwen3(), hf_tensors()
    with pytest.raises(ValueError, match="no place in the served model"):
        WeightMap(model, {"model.layers.0.self_attn.o_proj.weight": (8, 8)})
    wmap = WeightMap(model, {n: tuple(t.shape) for n, t in ts.items()})
    with pytest.raises(ValueError, match="inference.vllm.dtype"):
        wmap.check("model.layers.0.self_attn.k_proj.weight", torch.bfloat16, (4, 8))
    with pytest.raises(ValueError, match="24 rows in all, the parameter has 20"):
        WeightMap(model, {**{n: tuple(t.shape) for n, t in ts.items()}, "model.layers.0.self_attn.q_proj.weight": (16, 8)})
    with pytest.raises(ValueError, match="shape"):
        wmap.check("model.embed_tokens.weight", torch.float32, (50, 9))
    # a packed shard whose earlier siblings the weights do not name cannot be placed
    with pytest.raises(ValueError, match="after"):
        WeightMap(model, {"model.layers.0.self_attn.k_proj.weight": (4, 8)})
    # a tied head that differs from the embedding has no single place: refused before anything is copied
    wmap.check_shared(ts)
    with pytest.raises(ValueError, match="tied weights"):
        wmap.check_shared({**ts, "lm_head.weight": ts["lm_head.weight"] + 1e-3})


def _pack(layer, remove_weight):
    """Stands for vLLM's CPU `dispatch_cpu_unquantized_gemm`: a private packed copy, the weight left empty."""
    layer.cpu_linear = True
    layer.packed = layer.weight.detach().clone()
    if remove_weight:
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=layer.weight.dtype), requires_grad=False)


def _packed_model(ts):
    model = FakeVLLMQwen3()
    wmap = WeightMap(model, {n: tuple(t.shape) for n, t in ts.items()})
    with torch.no_grad():
        for n, t in ts.items():
            wmap.view(n).copy_(t)
    layer = model.model.layers[0]
    _pack(model.model.embed_tokens, remove_weight=False)  # embeddings keep their weight and a packed copy
    _pack(layer.self_attn.qkv_proj, remove_weight=True)
    _pack(layer.mlp.gate_up_proj, remove_weight=True)
    wmap.refresh(model)
    return model, wmap


def test_changed_layers_are_repacked_from_the_verified_tensors():
    from flywheel.inference.vllm_worker import place_in_place

    old, new = hf_tensors(0), hf_tensors(1)
    model, wmap = _packed_model(old)
    changed = ["model.layers.0.self_attn.k_proj.weight", "model.embed_tokens.weight", "lm_head.weight"]
    tensors = {**old, **{n: new[n] for n in changed}}
    with torch.no_grad():
        repacked = place_in_place(model, wmap, tensors, changed, dispatch=_pack)
    layer = model.model.layers[0]
    assert repacked == ["model.layers.0.self_attn.qkv_proj.weight"]  # gate_up did not change: not touched
    qkv = layer.self_attn.qkv_proj.packed  # q and v unchanged, k new, in vLLM's row order
    assert torch.equal(qkv, torch.cat([old["model.layers.0.self_attn.q_proj.weight"],
                                       new["model.layers.0.self_attn.k_proj.weight"],
                                       old["model.layers.0.self_attn.v_proj.weight"]]))
    assert wmap.repacked("model.layers.0.self_attn.q_proj.weight")  # the weight is left empty again
    assert torch.equal(layer.mlp.gate_up_proj.packed, torch.cat([old["model.layers.0.mlp.gate_proj.weight"],
                                                                 old["model.layers.0.mlp.up_proj.weight"]]))
    emb = model.model.embed_tokens  # copied in place and its packed copy rebuilt (the tied head multiplies by it)
    assert torch.equal(emb.weight.data[:50], new["model.embed_tokens.weight"]) and torch.equal(emb.packed, emb.weight)


def test_a_layout_without_a_repack_is_refused_before_anything_changes():
    from flywheel.inference import vllm_worker

    old, new = hf_tensors(0), hf_tensors(1)
    model, wmap = _packed_model(old)
    before = model.model.embed_tokens.weight.detach().clone()
    with pytest.raises(vllm_worker.NoKernelRepack):  # no vLLM here: its dispatch cannot be imported
        vllm_worker.place_in_place(model, wmap, new, list(new))
    assert torch.equal(model.model.embed_tokens.weight, before)
