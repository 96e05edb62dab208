"""Precision as config: inference.weight_dtype (served weights fake-quantized at load and at every swap),
inference.kv_dtype (K and V fake-quantized as written to the cache), trainer.matmul_precision (fp8 operands in
every decoder Linear, straight-through gradients, master weights untouched)."""

import asyncio
import copy

import pytest
import torch
import torch.nn.functional as F

from flywheel.config import ConfigError, ModelConfig, TrainerConfig, validate
from flywheel.inference.local import LocalEngine
from flywheel.modeling.decoder import DecoderRunner
from flywheel.modeling.quant import fake_quant, fake_quant_fp8, fake_quant_kv
from flywheel.policy.model import build_model
from flywheel.trainer.precision import apply_matmul_precision, matmul_precision_of, selected_linears
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, SamplingParams, Segment, Trajectory

VOCAB = 256
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=VOCAB)


@pytest.mark.parametrize("key,value", [("inference.weight_dtype", "fp6"), ("inference.kv_dtype", "int8"),
                                       ("trainer.matmul_precision", "fp4")])
def test_config_refuses_unknown_precisions_naming_the_key(key, value):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate({section: {name: value}})
    cfg = validate({"inference": {"weight_dtype": "nvfp4", "kv_dtype": "fp8_e4m3"},
                    "trainer": {"matmul_precision": "fp8_block"}})
    assert (cfg.inference.weight_dtype, cfg.inference.kv_dtype, cfg.trainer.matmul_precision) == \
        ("nvfp4", "fp8_e4m3", "fp8_block")


def test_engine_serves_quantized_weights_at_load_and_after_a_swap(tiny):
    model = copy.deepcopy(tiny)
    orig = {n: t.detach().clone() for n, t in model.state_dict().items()}
    engine = LocalEngine(model, weight_dtype="mxfp4", max_seq_len=256)
    sd = model.state_dict()
    assert torch.equal(sd[Q], fake_quant(orig[Q], "mxfp4")) and not torch.equal(sd[Q], orig[Q])
    assert torch.equal(sd["model.embed_tokens.weight"], orig["model.embed_tokens.weight"])
    assert torch.equal(sd["model.norm.weight"], orig["model.norm.weight"])
    new = orig[Q] * 1.5 + 0.01
    engine.update_weights(1, {Q: new, "model.norm.weight": orig["model.norm.weight"] * 2})
    sd = model.state_dict()
    assert torch.equal(sd[Q], fake_quant(new, "mxfp4"))
    assert torch.equal(sd["model.norm.weight"], orig["model.norm.weight"] * 2)
    with pytest.raises(ValueError, match="unknown low-precision format"):
        LocalEngine(copy.deepcopy(tiny), weight_dtype="fp2")


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
def test_kv_cache_holds_quantized_keys_and_values_in_prefill_and_decode(tiny, fmt):
    ids = list(range(5, 45))
    ref, quant = DecoderRunner(tiny, 256), DecoderRunner(tiny, 256, kv_dtype=fmt)
    with torch.inference_mode():
        c_ref, c_q = ref.new_cache(64), quant.new_cache(64)
        logits_ref, _ = ref.prefill(ids, c_ref)
        logits_q, _ = quant.prefill(ids, c_q)
        n = len(ids)
        # layer 0's keys depend on the tokens only: the quantized cache is exactly the format of the reference's
        assert torch.equal(c_q.k[0, :, :n], fake_quant_kv(c_ref.k[0, :, :n], fmt))
        assert torch.equal(c_q.v[0, :, :n], fake_quant_kv(c_ref.v[0, :, :n], fmt))
        assert not torch.equal(c_q.k[0, :, :n], c_ref.k[0, :, :n])
        assert not torch.equal(logits_q, logits_ref)
        ref.decode([7], [c_ref])
        quant.decode([7], [c_q])
        assert torch.equal(c_q.k[0, :, n], fake_quant_kv(c_ref.k[0, :, n], fmt))
        # one scale per token vector: with batch-invariant math a decoded token's cache entry equals a prefill's
        bi = DecoderRunner(tiny, 256, batch_invariant=True, kv_dtype=fmt)
        c_dec, c_full = bi.new_cache(64), bi.new_cache(64)
        bi.prefill(ids, c_dec)
        bi.decode([7], [c_dec])
        bi.prefill(ids + [7], c_full)
        for li in range(bi.num_layers):
            assert torch.equal(c_full.k[li, :, :n + 1], c_dec.k[li, :, :n + 1])
            assert torch.equal(c_full.v[li, :, :n + 1], c_dec.v[li, :, :n + 1])


def test_engine_with_kv_dtype_generates(tiny):
    async def main(kv):
        async with LocalEngine(copy.deepcopy(tiny), kv_dtype=kv, max_seq_len=256) as engine:
            return await engine.generate(list(range(1, 30)), SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))
    base, q = asyncio.run(main("bf16")), asyncio.run(main("mxfp4"))
    assert len(q.token_ids) == 8 and q.logprobs != base.logprobs


def test_fp8_linear_forward_and_straight_through_backward(tiny):
    model = apply_matmul_precision(copy.deepcopy(tiny), "fp8_tensor")
    assert matmul_precision_of(model) == "fp8_tensor" and matmul_precision_of(tiny) == "bf16"
    names = [n for n, _ in selected_linears(model)]
    assert "lm_head" not in names and any(n.endswith("q_proj") for n in names)
    lin = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 7, lin.in_features, requires_grad=True)
    y = lin(x)
    xq, wq = fake_quant_fp8(x.detach()), fake_quant_fp8(lin.weight.detach())
    assert torch.equal(y, F.linear(xq, wq, lin.bias))
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(lin.weight.grad, g.reshape(-1, g.shape[-1]).T @ xq.reshape(-1, xq.shape[-1]))
    assert torch.allclose(x.grad, g @ wq)  # straight through the input's rounding, with the rounded weight
    assert torch.equal(model.state_dict()[Q], tiny.state_dict()[Q])  # master weights untouched
    twin = copy.deepcopy(model)  # the copy's forward reads the copy's weights
    with torch.no_grad():
        twin.model.layers[0].self_attn.q_proj.weight.mul_(2)
    assert not torch.equal(twin.model.layers[0].self_attn.q_proj(x), lin(x))
    with pytest.raises(ValueError, match="already run 'fp8_tensor'"):
        apply_matmul_precision(model, "fp8_block")
    with pytest.raises(ValueError, match="numerics.batch_invariant = false"):
        apply_matmul_precision(copy.deepcopy(tiny), "fp8_block", batch_invariant=True)


def _trajs(num=4):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(num):
        p, c = torch.randint(0, VOCAB, (12,), generator=g).tolist(), torch.randint(0, VOCAB, (6,), generator=g).tolist()
        seg = Segment(token_ids=p + c, loss_mask=[0] * 12 + [1] * 6, logprobs=[0.0] * 12 + [-5.5] * 6,
                      versions=[0] * 18)
        out.append(Trajectory(task_id="t", group_id=f"g{i // 2}", segments=[seg], reward=Reward(value=float(i % 2))))
    return out


def test_trainer_step_with_fp8_matmuls_changes_logprobs_not_the_optimizer_state_layout(tiny):
    steps = {}
    for prec in ("bf16", "fp8_tensor", "fp8_block"):
        trainer = Trainer(copy.deepcopy(tiny), TrainerConfig(lr=1e-3, matmul_precision=prec, micro_batch_tokens=4096))
        steps[prec] = (trainer.step(_trajs()), trainer)
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    k1 = {p: s["mismatch/k1"] for p, (s, _) in steps.items()}
    assert k1["bf16"] != k1["fp8_tensor"] and k1["fp8_tensor"] != k1["fp8_block"]
    assert all(torch.isfinite(torch.tensor(v)) for v in k1.values())
    w = {p: t.model.state_dict()[Q] for p, (_, t) in steps.items()}
    assert not torch.equal(w["fp8_tensor"], tiny.state_dict()[Q])  # it trained, in fp32 master weights
    assert len(set(w["fp8_tensor"].flatten().tolist())) > 1000  # not on an fp8 grid
