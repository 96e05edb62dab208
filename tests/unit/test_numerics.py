"""Batch-invariant mode: engine alone == engine in a batch of 32 == trainer, bit for bit (dense and MoE);
prefill == decode; router replay and its per-layer agreement; the mismatch and agreement formulas."""

import asyncio
import copy
import math
import random

import pytest
import torch

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.modeling.attention import ATTN_TILE, key_span, sequence_attention
from flywheel.modeling.batch_invariant import BatchInvariantForward
from flywheel.modeling.decoder import DecoderRunner
from flywheel.policy.logprobs import logprobs_from_logits, token_logprobs
from flywheel.policy.model import build_model
from flywheel.trainer.mismatch import mismatch_metrics
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, SamplingParams, Segment, Trajectory

VOCAB = 512


@pytest.fixture(scope="module")
def models():
    return {p: build_model(ModelConfig(preset=p, max_seq_len=512), vocab_size=VOCAB) for p in ("tiny", "tiny-moe")}


def _prompts(n, seed, lo=3, hi=90):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _generate(model, prompts, params, batch_invariant=True):
    async def main():
        async with LocalEngine(model, batch_invariant=batch_invariant) as engine:
            alone = await engine.generate(prompts[0], params[0])
            together = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))
            assert max(s[3] for s in engine.step_log) >= 16  # the probe really shared decode steps
            return alone, together
    return asyncio.run(main())


def _trajectories(prompts, gens):
    out = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        routed = None if g.routed_experts is None else [[] for _ in p] + g.routed_experts
        seg = Segment(token_ids=p + g.token_ids, loss_mask=[0] * len(p) + [1] * len(g.token_ids),
                      logprobs=[0.0] * len(p) + g.logprobs, versions=[-1] * len(p) + g.versions,
                      routed_experts=routed)
        out.append(Trajectory(task_id="t", group_id=f"g{i % 4}", segments=[seg], reward=Reward(value=float(i % 2))))
    return out


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_engine_alone_in_a_batch_of_32_and_trainer_are_bit_identical(models, preset):
    model = models[preset]
    prompts = _prompts(32, seed=1)  # prompt lengths cross the 64-key tiles
    params = [SamplingParams(temperature=1.0, max_new_tokens=8 + i % 5, seed=i) for i in range(32)]
    alone, together = _generate(model, prompts, params)
    assert alone.logprobs == together[0].logprobs and alone.token_ids == together[0].token_ids

    # the trainer's batch-invariant forward over the whole padded batch, and over the probe alone
    fwd = BatchInvariantForward(model)
    seqs = [p + g.token_ids for p, g in zip(prompts, together)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        lp = logprobs_from_logits(fwd(ids)[0][:, :-1], ids[:, 1:])
        lp_alone = logprobs_from_logits(fwd(ids[:1, :len(seqs[0])])[0][:, :-1], ids[:1, 1:len(seqs[0])])
        hf = token_logprobs(model, ids)
    worst_hf = 0.0
    for i, (p, g) in enumerate(zip(prompts, together)):
        n = len(g.token_ids)
        assert lp[i, len(p) - 1:len(p) - 1 + n].tolist() == g.logprobs, f"session {i} differs"
        worst_hf = max(worst_hf, (hf[i, len(p) - 1:len(p) - 1 + n] - torch.tensor(g.logprobs)).abs().max().item())
    assert lp_alone[0, len(prompts[0]) - 1:].tolist() == alone.logprobs
    assert 0 < worst_hf < 1e-4  # the HF forward is close but not bit-identical: the mode is what removes it

    # and the Trainer reports zero mismatch in batch-invariant mode (its micro-batches pad differently)
    cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=1024)
    m = Trainer(copy.deepcopy(model), cfg, batch_invariant=True).step(_trajectories(prompts, together))
    assert m["mismatch/max_abs_diff"] == 0.0 and m["mismatch/k3"] == 0.0 and m["num_micro_batches"] > 1
    if preset == "tiny-moe":
        assert m["router_agreement"] == 1.0
        assert [m[f"router_agreement/layer_{i}"] for i in range(4)] == [1.0] * 4
    m_default = Trainer(copy.deepcopy(model), cfg).step(_trajectories(prompts, together))
    assert 0 < m_default["mismatch/max_abs_diff"] < 1e-4


def test_prefill_and_decode_give_the_same_logits_across_tile_boundaries(models):
    model = models["tiny"]
    ids = _prompts(1, seed=2, lo=ATTN_TILE + 10, hi=ATTN_TILE + 10)[0]
    runner = DecoderRunner(model, 512, batch_invariant=True)
    start = ATTN_TILE - 3  # decode positions 61..73 cross the tile at 64
    cache = runner.new_cache(len(ids))
    runner.prefill(ids[:start], cache)
    for pos in range(start, len(ids)):
        decoded, _ = runner.decode([ids[pos]], [cache])
        full = runner.new_cache(pos + 1)
        prefilled, _ = runner.prefill(ids[:pos + 1], full)
        assert torch.equal(decoded[0], prefilled), f"position {pos}"
    assert key_span(63) == 64 and key_span(64) == 128


def test_sequence_attention_is_causal_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 70, h, 16, generator=g) for h in (6, 2, 2))
    ours = sequence_attention(q, k, v, 0.25)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=True, scale=0.25, enable_gqa=True)
    assert torch.allclose(ours, ref.transpose(1, 2).reshape(2, 70, 96), atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_batch_invariant_forward_matches_hf_values_and_gradients(models, preset):
    model = copy.deepcopy(models[preset])
    ids = torch.randint(3, VOCAB, (2, 21), generator=torch.Generator().manual_seed(3))
    logits, _ = BatchInvariantForward(model)(ids)
    hf = model(input_ids=ids).logits
    assert torch.allclose(logits, hf, atol=1e-5)
    logits.square().mean().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(input_ids=ids).logits.square().mean().backward()
    assert set(ours) == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        assert torch.allclose(ours[n], p.grad, rtol=1e-3, atol=1e-7), n


def test_replay_in_batch_invariant_forward(models):
    model = copy.deepcopy(models["tiny-moe"])
    fwd = BatchInvariantForward(model)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    runner = fwd.runner
    # the model's own routing, from the engine's runner, replayed: bit-identical to routing freely
    own = torch.full((2, 9, 4, 2), -1)
    for b in range(2):
        for t in range(9):
            own[b, t] = runner.prefill(ids[b, :t + 1].tolist(), runner.new_cache(t + 1))[1]
    with torch.no_grad():
        free, _ = fwd(ids)
        replayed, stats = fwd(ids, own)
    assert torch.equal(free, replayed) and stats.layer_agree == stats.layer_replayed == [18] * 4
    # foreign routing is used: agreement drops, logits move, and the router still gets gradients
    g = torch.Generator().manual_seed(5)
    foreign = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(2 * 9 * 4)]).reshape(2, 9, 4, 2)
    foreign[1, :4] = -1
    other, stats = fwd(ids, foreign)
    assert stats.num_replayed == 4 * (9 + 5) and stats.num_agree / stats.num_replayed < 0.5
    assert not torch.allclose(free, other, atol=1e-3) and torch.equal(other[1, :4], free[1, :4])
    other.square().mean().backward()
    assert all(float(layer.mlp.gate.weight.grad.abs().sum()) > 0 for layer in model.model.layers)
    with pytest.raises(ValueError, match="routed_experts must be"):
        fwd(ids, foreign[:, :, :2])
    measured, stats = fwd(ids, foreign, apply_replay=False)  # only measures
    assert torch.equal(measured, free) and stats.num_agree / stats.num_replayed < 0.5


def test_router_agreement_per_layer_is_hand_computed():
    model = build_model(ModelConfig(preset="tiny-moe"), vocab_size=64)
    prompt, comp = [5, 6, 7, 8], [9, 10, 11]
    runner = DecoderRunner(model, 64)
    routed = []
    for i in range(len(comp)):  # the routing of the forward that produced token i
        routed.append(runner.prefill(prompt + comp[:i], runner.new_cache(8))[1].tolist())
    routed[0][1] = [(routed[0][1][0] + 1) % 8, (routed[0][1][1] + 1) % 8]  # layer 1 disagrees on token 0
    routed[2][3] = [(routed[2][3][0] + 3) % 8, (routed[2][3][1] + 3) % 8]  # layer 3 disagrees on token 2
    seg = Segment(token_ids=prompt + comp, loss_mask=[0] * 4 + [1] * 3, logprobs=[0.0] * 7, versions=[0] * 7,
                  routed_experts=[[]] * 4 + routed)
    traj = Trajectory(task_id="t", group_id="g", segments=[seg], reward=Reward(value=1.0))
    for bi in (False, True):
        m = Trainer(copy.deepcopy(model), TrainerConfig(lr=1e-6, router_replay=False), batch_invariant=bi).step([traj])
        assert [m[f"router_agreement/layer_{i}"] for i in range(4)] == [1.0, 2 / 3, 1.0, 2 / 3]
        assert m["router_agreement"] == pytest.approx(10 / 12)


def test_mismatch_metrics_hand_computed():
    # three generated tokens with trainer/sampler ratios 1.5, 1 and 0.1; the fourth is a prompt token
    trainer = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.01), 0.0]], dtype=torch.float64)
    sampler = torch.tensor([[math.log(0.4), math.log(0.3), math.log(0.1), -5.0]], dtype=torch.float64)
    m = mismatch_metrics(trainer, sampler, torch.tensor([[1, 1, 1, 0]]), tis_cap=1.4, icepop_alpha=0.6, icepop_beta=1.4)
    a, c = math.log(1.5), math.log(0.1)
    assert m["k1"] == pytest.approx(-(a + c) / 3) and m["k3"] == pytest.approx((0.5 - a + 0.1 - 1 - c) / 3)
    assert m["max_abs_diff"] == pytest.approx(-c) and m["mean_abs_diff"] == pytest.approx((a - c) / 3)
    assert m["frac_outside_0.5_2"] == pytest.approx(1 / 3) and m["frac_outside_0.2_5"] == pytest.approx(1 / 3)
    assert m["tis_clip_frac"] == pytest.approx(1 / 3) and m["icepop_mask_frac"] == pytest.approx(2 / 3)
    assert m["seq_log_ratio_mean"] == pytest.approx(math.log(0.15))


def test_bad_configurations_are_refused(models):
    with pytest.raises(ValueError, match="trainer.dtype"):
        Trainer(copy.deepcopy(models["tiny"]), TrainerConfig(dtype="bfloat16"), batch_invariant=True)
    bf16 = copy.deepcopy(models["tiny"]).to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        BatchInvariantForward(bf16)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64))  # no family
    with pytest.raises(ValueError, match="'gpt2' is not in the native registry"):
        LocalEngine(gpt2, batch_invariant=True)
    with pytest.raises(ValueError, match="'gpt2' is not in the native registry"):
        Trainer(gpt2, TrainerConfig(), batch_invariant=True)
    with pytest.raises(ValueError, match="batch, tokens"):
        BatchInvariantForward(models["tiny"])(torch.zeros(5, dtype=torch.long))


def test_chunked_pv_and_decode_attention_are_extension_invariant():
    """A query reduced over more keys than its span (masked, finite) gets the same bits: what lets a decode
    step attend over the longest span of its batch, in place on the KV pool."""
    from flywheel.modeling.attention import chunked_pv, decode_attention

    g = torch.Generator().manual_seed(6)
    for pos, extra in [(70, 64), (191, 256), (200, 192), (255, 448), (300, 64)]:
        span = key_span(pos)
        s = torch.randn(2, 8, span + extra, generator=g)
        s[..., pos + 1:] = float("-inf")
        p = torch.softmax(s, dim=-1)
        v = torch.randn(2, span + extra, 16, generator=g)  # finite values after the position, as in a cache
        assert torch.equal(chunked_pv(p[..., :span], v[:, :span]), chunked_pv(p, v)), (pos, extra)
        q = torch.randn(1, 6, 16, generator=g)
        k = torch.randn(1, 2, span + extra, 16, generator=g)
        vv = torch.randn(1, 2, span + extra, 16, generator=g)
        positions = torch.tensor([pos])
        own = decode_attention(q, k[:, :, :span], vv[:, :, :span], positions, 0.25)
        assert torch.equal(own, decode_attention(q, k, vv, positions, 0.25)), (pos, extra)
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k[:, :, :pos + 1], vv[:, :, :pos + 1],
                                                               scale=0.25, enable_gqa=True)
        assert torch.allclose(own, ref.reshape(1, -1), atol=1e-5)


def test_default_decode_attends_over_the_pool_with_holes_and_detach_frees_the_slot(models):
    """Default mode: one masked SDPA call per layer over the pool's slot range (rows at slots 0 and 2, slot 1
    given back by `detach`), each row attending over its own length only: the HF forward's logits."""
    model = models["tiny"]
    runner = DecoderRunner(model, 512)
    prompts = _prompts(3, seed=9, lo=20, hi=70)
    caches = [runner.new_cache(len(p) + 8) for p in prompts]
    for p, c in zip(prompts, caches):
        runner.prefill(p, c)
    stored = caches[1].k[:, :, :len(prompts[1])].clone()
    kept = runner.detach(caches[1])
    assert runner.kv_pool.num_live == 2 and kept.length == len(prompts[1]) and torch.equal(kept.k, stored)
    logits, _ = runner.decode([5, 6], [caches[0], caches[2]])
    assert caches[0].length == len(prompts[0]) + 1
    with torch.no_grad():
        for i, (p, t) in enumerate([(prompts[0], 5), (prompts[2], 6)]):
            ref = model(torch.tensor([p + [t]])).logits[0, -1]
            assert (logits[i] - ref).abs().max() < 1e-4, i


def test_kv_pool_slots_growth_release_and_decode_with_holes(models):
    import gc

    runner = DecoderRunner(models["tiny"], 512, batch_invariant=True)
    pool = runner.kv_pool
    prompts = _prompts(3, seed=8, lo=20, hi=70)
    caches = [runner.new_cache(len(p) + 8) for p in prompts]
    assert [c.slot for c in caches] == [0, 1, 2] and pool.num_live == 3
    for p, c in zip(prompts, caches):
        runner.prefill(p, c)
    stored = caches[0].k[:, :, :len(prompts[0])].clone()
    long = runner.new_cache(300)  # grows the capacity: contents are copied, caches see the new pool
    assert pool.capacity >= 320 and torch.equal(caches[0].k[:, :, :len(prompts[0])], stored)
    assert long.slot == 3 and float(long.k.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="capacity"):
        runner.new_cache(0)
    del caches[1], long  # slots 1 and 3 return on garbage collection: the step's rows are slots 0 and 2
    gc.collect()
    assert pool.num_live == 2 and runner.new_cache(10).slot == 1  # lowest free first (and released again)
    gc.collect()
    together, _ = runner.decode([5, 6], caches)
    for i, p in enumerate([prompts[0], prompts[2]]):
        alone = runner.new_cache(len(p) + 8)
        runner.prefill(p, alone)
        logits, _ = runner.decode([5 + i], [alone])
        assert torch.equal(logits[0], together[i]), i
        del alone
    caches[0].release()
    caches[1].release()
    caches = None
    gc.collect()
    assert pool.num_live == 0 and pool.k is None  # idle pool gives its memory back


def test_a_decode_step_moves_its_rows_into_freed_slots_below_them(models):
    """After the first half of a batch finished, its rows' slots are free: the next step moves the caches above
    them down (slot range 0..2 instead of 2..4), and their logits are still the bits of decoding alone."""
    import gc

    runner = DecoderRunner(models["tiny"], 512, batch_invariant=True)
    pool = runner.kv_pool
    prompts = _prompts(4, seed=3, lo=20, hi=70)
    caches = [runner.new_cache(len(p) + 8) for p in prompts]
    for p, cache in zip(prompts, caches):
        runner.prefill(p, cache)
    stored = [c.k[:, :, :c.length].clone() for c in caches[2:]]
    caches[0].release()
    caches[1].release()
    live = caches[2:]
    together, _ = runner.decode([5, 6], live)
    assert sorted(c.slot for c in live) == [0, 1] and pool.num_live == 2
    assert all(torch.equal(c.k[:, :, :len(p)], k) for c, p, k in zip(live, prompts[2:], stored))
    assert pool.compact(live) == 0  # already together
    for i, p in enumerate(prompts[2:]):
        alone = runner.new_cache(len(p) + 8)
        runner.prefill(p, alone)
        logits, _ = runner.decode([5 + i], [alone])
        assert torch.equal(logits[0], together[i]), i
        alone.release()
    del caches, live, cache
    gc.collect()
    assert pool.num_live == 0
