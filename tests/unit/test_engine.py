"""LocalEngine: concurrent sessions vs decoding alone, weight swaps, log-prob agreement, bad input."""

import asyncio
import random

import pytest
import torch

from flywheel.config import InferenceConfig, ModelConfig
from flywheel.inference.base import Engine
from flywheel.inference.local import LocalEngine, build_engine
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model
from flywheel.types import SamplingParams

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def tiny():
    return build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=2048)


@pytest.fixture(scope="module")
def tiny_moe():
    return build_model(ModelConfig(preset="tiny-moe", max_seq_len=256), vocab_size=2048)


def _prompts(n, seed=0, lo=3, hi=60):
    rng = random.Random(seed)
    return [[rng.randrange(2048) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


async def _alone(engine, prompts, params):
    return [await engine.generate(p, sp) for p, sp in zip(prompts, params)]


async def _together(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))


def test_sixteen_concurrent_sessions_match_decoding_alone(tiny):
    """Default mode (not batch-invariant): a row's linears and attention run inside the batch (no row padding,
    one SDPA call over the longest row's keys), so log-probs may differ from decoding alone in the last bits;
    numerics.batch_invariant makes them bit-identical (tests/unit/test_numerics.py)."""
    prompts = _prompts(16)
    rng = random.Random(1)
    params = [SamplingParams(max_new_tokens=rng.randint(4, 24), **GREEDY) for _ in prompts]

    async def main():
        async with LocalEngine(tiny) as engine:
            assert isinstance(engine, Engine)
            alone = await _alone(engine, prompts, params)
            together = await _together(engine, prompts, params)
            assert max(s[3] for s in engine.step_log) == 16  # they really shared decode steps
            return alone, together

    alone, together = asyncio.run(main())
    for p, sp, a, t in zip(prompts, params, alone, together):
        assert t.token_ids == a.token_ids
        assert max(abs(x - y) for x, y in zip(t.logprobs, a.logprobs)) < 1e-5  # measured: float32 rounding
        assert len(t.token_ids) == sp.max_new_tokens and t.finish_reason == "length"
        assert t.prompt_len == len(p) and t.versions == [0] * sp.max_new_tokens
        # the continuation is the model's own: each token is the argmax of a full HF forward
        with torch.no_grad():
            logits = tiny(torch.tensor([p + t.token_ids])).logits[0, len(p) - 1:-1]
        top2 = logits.topk(2, dim=-1)
        clear = (top2.values[:, 0] - top2.values[:, 1]) > 1e-4
        assert torch.equal(top2.indices[:, 0][clear], torch.tensor(t.token_ids)[clear])


def test_seeded_sampling_is_reproducible_in_any_batch(tiny):
    prompts = _prompts(6, seed=3)
    params = [SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=12, seed=i) for i in range(6)]

    async def main():
        async with LocalEngine(tiny) as engine:
            return await _alone(engine, prompts, params), await _together(engine, prompts, params)

    alone, together = asyncio.run(main())
    assert [g.token_ids for g in alone] == [g.token_ids for g in together]
    assert len({tuple(g.token_ids) for g in alone}) == 6


def _perturbed(model, scale=0.05, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return {n: (p + scale * torch.randn(p.shape, generator=gen)).contiguous()
            for n, p in model.state_dict().items()}


def test_weight_swap_mid_generation(tiny):
    base = build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=2048)
    new_sd = _perturbed(base)
    prompts = _prompts(4, seed=5)
    n = 120  # long enough that the poll below always catches the engine mid-sequence
    params = [SamplingParams(max_new_tokens=n, **GREEDY) for _ in prompts]

    async def main():
        async with LocalEngine(base) as engine:
            tasks = [asyncio.create_task(engine.generate(p, sp)) for p, sp in zip(prompts, params)]
            while len(engine.step_log) < 5:
                await asyncio.sleep(0.002)
            # Hold decoding so the swap lands mid-sequence however slow this thread is scheduled (a busy CI
            # machine once let all the steps finish before the update thread ran); the update itself still
            # comes from another thread and takes the step lock like a live one.
            engine.pause()
            assert len(engine.step_log) < n, "generation finished before the test could pause it"
            pause_ms = await asyncio.to_thread(engine.update_weights, 1, new_sd)
            engine.resume()
            gens = await asyncio.gather(*tasks)
            after = await engine.generate(prompts[0], params[0])
            return gens, after, pause_ms, engine.version

    gens, after, pause_ms, version = asyncio.run(main())
    assert version == 1 and 0 <= pause_ms < 50
    for g in gens:
        assert len(g.token_ids) == n
        swap_at = g.versions.index(1)
        assert 0 < swap_at < n and g.versions == [0] * swap_at + [1] * (n - swap_at)
    # a request after the swap equals a fresh engine on a model that always had the new weights
    fresh = build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=2048)
    fresh.load_state_dict(new_sd)

    async def ref():
        async with LocalEngine(fresh, version=1) as engine:
            return await engine.generate(prompts[0], params[0])

    expected = asyncio.run(ref())
    assert after.token_ids == expected.token_ids and after.versions == [1] * n


def test_rejected_weight_update_keeps_previous_version(tiny):
    prompt = _prompts(1, seed=9)[0]
    sp = SamplingParams(max_new_tokens=10, **GREEDY)
    good = tiny.state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"

    async def main():
        async with LocalEngine(tiny, version=3) as engine:
            before = await engine.generate(prompt, sp)
            bad_updates = {
                "unknown tensor 'model.layers.0.attn.q.weight'": {"model.layers.0.attn.q.weight": good[name]},
                "has shape (4, 4)": {**good, name: torch.zeros(4, 4)},
                "has dtype torch.float64": {**good, name: good[name].double()},
            }
            for message, tensors in bad_updates.items():
                with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
                    engine.update_weights(4, tensors)
            with pytest.raises(TypeError, match="expected a torch.Tensor"):
                engine.update_weights(4, {name: [[0.0]]})
            assert engine.version == 3
            again = await engine.generate(prompt, sp)
            return before, again

    before, again = asyncio.run(main())
    assert again.token_ids == before.token_ids and again.versions == [3] * 10
    assert torch.equal(tiny.state_dict()[name], good[name])


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_agree_with_trainer(preset, temperature, tiny, tiny_moe):
    model = tiny if preset == "tiny" else tiny_moe
    prompts = _prompts(8, seed=11)
    params = [SamplingParams(temperature=temperature, max_new_tokens=16, seed=i) for i in range(8)]

    async def main():
        async with LocalEngine(model) as engine:
            return await _together(engine, prompts, params)

    worst = 0.0
    for p, g in zip(prompts, asyncio.run(main())):
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([p + g.token_ids]), temperature=temperature)[0, len(p) - 1:]
        worst = max(worst, (lp - torch.tensor(g.logprobs)).abs().max().item())
    assert worst < 1e-4  # docs/inference.md: measured max |Δ| ~1e-6


def test_moe_routed_experts_match_hf_router(tiny_moe):
    prompt = _prompts(1, seed=13)[0]

    async def main():
        async with LocalEngine(tiny_moe) as engine:
            return await engine.generate(prompt, SamplingParams(max_new_tokens=12, **GREEDY))

    g = asyncio.run(main())
    assert len(g.routed_experts) == 12 and all(len(t) == 4 and all(len(k) == 2 for k in t) for t in g.routed_experts)
    with torch.no_grad():
        out = tiny_moe(torch.tensor([prompt + g.token_ids]), output_router_logits=True)
    for layer, logits in enumerate(out.router_logits):  # [T, E] per layer
        hf = logits.topk(2, dim=-1).indices[len(prompt) - 1:-1]
        for t in range(12):
            assert sorted(g.routed_experts[t][layer]) == sorted(hf[t].tolist())


def test_dense_model_reports_no_routed_experts(tiny):
    async def main():
        async with LocalEngine(tiny) as engine:
            return await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))

    assert asyncio.run(main()).routed_experts is None


def test_bad_requests_raise_clear_errors(tiny):
    async def main():
        async with LocalEngine(tiny, max_seq_len=64) as engine:
            with pytest.raises(ValueError, match="does not fit the context of 64"):
                await engine.generate(list(range(64)), SamplingParams())
            with pytest.raises(ValueError, match="empty"):
                await engine.generate([], SamplingParams())
            with pytest.raises(ValueError, match="not an int in"):
                await engine.generate([1, 5000], SamplingParams())
            with pytest.raises(ValueError, match="top_p"):
                await engine.generate([1], SamplingParams(top_p=0.0))
            with pytest.raises(ValueError, match="temperature"):
                await engine.generate([1], SamplingParams(temperature=-1))
            with pytest.raises(ValueError, match="need a tokenizer"):
                await engine.generate([1], SamplingParams(stop=["x"]))
            # max_new_tokens past the context is clamped: finish 'length' at the context edge
            g = await engine.generate(list(range(60)), SamplingParams(max_new_tokens=50, **GREEDY))
            assert len(g.token_ids) == 4 and g.finish_reason == "length"
            return await engine.generate([1, 2], SamplingParams(max_new_tokens=3))  # still serving

    assert len(asyncio.run(main()).token_ids) == 3


def _word_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(2048)}, unk_token="w0"))
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_stop_token_ids_and_stop_strings(tiny):
    tok = _word_tokenizer()
    prompt = _prompts(1, seed=17)[0]

    async def main():
        async with LocalEngine(tiny, tokenizer=tok) as engine:
            full = await engine.generate(prompt, SamplingParams(max_new_tokens=20, **GREEDY))
            k = 6
            by_id = await engine.generate(prompt, SamplingParams(max_new_tokens=20, stop_token_ids=[full.token_ids[k]],
                                                                 **GREEDY))
            text = tok.decode(full.token_ids[k:k + 2])
            by_str = await engine.generate(prompt, SamplingParams(max_new_tokens=20, stop=[text], **GREEDY))
            return full, by_id, by_str, k

    full, by_id, by_str, k = asyncio.run(main())
    first = full.token_ids.index(full.token_ids[k])
    assert by_id.token_ids == full.token_ids[:first + 1] and by_id.finish_reason == "stop"
    assert by_str.finish_reason == "stop" and by_str.token_ids == full.token_ids[:len(by_str.token_ids)]
    assert len(by_str.token_ids) <= k + 2


def test_pause_holds_requests_until_resume(tiny):
    async def main():
        async with LocalEngine(tiny) as engine:
            engine.pause()
            task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4)))
            await asyncio.sleep(0.3)
            assert not task.done()
            engine.resume()
            return await asyncio.wait_for(task, 10)

    assert len(asyncio.run(main()).token_ids) == 4


def test_stop_aborts_waiting_requests(tiny):
    async def main():
        engine = LocalEngine(tiny)
        await engine.start()
        engine.pause()
        task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4)))
        await asyncio.sleep(0.05)
        await engine.stop()
        return await task

    assert asyncio.run(main()).finish_reason == "aborted"


def test_generic_hf_path_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    from flywheel.modeling.hf_runner import HFRunner

    torch.manual_seed(0)  # GPT-2: not a family of the native registry (modeling/families.py)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128)).eval()
    prompts = _prompts(3, seed=19, hi=20)
    prompts = [[t % 512 for t in p] for p in prompts]

    async def main():
        async with build_engine(InferenceConfig(max_batch_size=8), model) as engine:
            assert isinstance(engine.runner, HFRunner) and engine.prefix_cache is None
            return await _together(engine, prompts, [SamplingParams(max_new_tokens=6, **GREEDY)] * 3)

    for p, g in zip(prompts, asyncio.run(main())):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False)[0, len(p):]
        assert g.token_ids == ref.tolist()


def test_a_bf16_engine_of_a_float32_policy_takes_float32_updates_and_rounds_them(tiny, tmp_path):
    """inference.dtype = "bfloat16": the engine serves bf16 weights, the trainer publishes float32 ones."""
    from flywheel.config import FlywheelConfig
    from flywheel.inference.registry import build_engine as build_for

    tiny.save_pretrained(tmp_path / "m")
    cfg = FlywheelConfig.model_validate({"model": {"dtype": "float32"}, "inference": {"dtype": "bfloat16"}})
    engine = build_for(cfg, tmp_path / "m", None, tmp_path / "log")
    name = "model.layers.0.self_attn.q_proj.weight"
    served = engine.model.state_dict()[name]
    assert served.dtype == torch.bfloat16
    new = {k: v.detach().float() + 0.001 for k, v in tiny.state_dict().items() if v.is_floating_point()}
    engine.update_weights(1, new)
    assert torch.equal(engine.model.state_dict()[name], new[name].to(torch.bfloat16)) and engine.version == 1
    with pytest.raises(ValueError, match="has dtype torch.bfloat16, the model expects torch.float32"):
        engine.update_weights(2, {name: new[name].to(torch.bfloat16)})
    sp = SamplingParams(max_new_tokens=6, **GREEDY)
    out = asyncio.run(_alone_started(engine, _prompts(2, seed=3), [sp, sp]))
    assert all(len(g.token_ids) == 6 and g.versions == [1] * 6 for g in out)


async def _alone_started(engine, prompts, params):
    async with engine:
        return await _alone(engine, prompts, params)


def test_a_bf16_engine_is_refused_where_log_probs_must_be_the_trainers_bit_for_bit():
    from flywheel.config import FlywheelConfig

    with pytest.raises(ValueError, match="inference.dtype = 'model'"):
        FlywheelConfig.model_validate({"inference": {"dtype": "bfloat16"}, "numerics": {"batch_invariant": True}})
