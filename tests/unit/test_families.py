"""The native decoder across the registry (modeling/families.py): for a tiny preset of each family, its logits
equal the HF forward's, prefix reuse equals a whole prefill, batch-invariant engine log-probs equal the trainer's
forward bit for bit (and MoE routing replays); models outside the registry or its limits take the HF fallback,
with the reason."""

import asyncio
import copy
import logging

import pytest
import torch

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.modeling.batch_invariant import BatchInvariantForward
from flywheel.modeling.decoder import DecoderRunner
from flywheel.modeling.families import FAMILIES, native_family
from flywheel.modeling.hf_runner import HFRunner
from flywheel.modeling.runner import Runner, runner_for
from flywheel.policy.logprobs import logprobs_from_logits
from flywheel.policy.model import build_model
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, SamplingParams, Segment, Trajectory

VOCAB = 512
PRESETS = {"llama": "tiny-llama", "qwen2": "tiny-qwen2", "mistral": "tiny-mistral", "qwen3": "tiny",
           "qwen3_moe": "tiny-moe"}


@pytest.fixture(scope="module")
def models():
    return {fam: build_model(ModelConfig(preset=p, max_seq_len=256), vocab_size=VOCAB) for fam, p in PRESETS.items()}


def test_every_registry_family_has_a_preset():
    assert set(PRESETS) == set(FAMILIES)


@pytest.mark.parametrize("family", list(PRESETS))
def test_native_logits_equal_the_hf_forward(models, family):
    model = models[family]
    assert native_family(model, 256)[0].name == family
    ids = [int(t) for t in torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))]
    runner = DecoderRunner(model, 256)
    cache = runner.new_cache(len(ids))
    prefilled, _ = runner.prefill(ids[:30], cache)
    steps = [runner.decode([t], [cache])[0][0] for t in ids[30:]]
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([ids])).logits[0].float()
    assert (prefilled - hf[29]).abs().max() < 1e-4
    for i, logits in enumerate(steps):
        assert (logits - hf[30 + i]).abs().max() < 1e-4, f"decode position {30 + i}"
    again = runner.new_cache(len(ids))  # a reused prefix: the first 30 positions copied, the rest prefilled
    again.k[:, :, :30], again.v[:, :, :30], again.length = cache.k[:, :, :30], cache.v[:, :, :30], 30
    reused, _ = runner.prefill(ids, again, start=30)
    assert (reused - hf[-1]).abs().max() < 1e-4


def _batch(prompts, gens) -> list[Trajectory]:
    out = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        routed = None if g.routed_experts is None else [[] for _ in p] + g.routed_experts
        seg = Segment(token_ids=p + g.token_ids, loss_mask=[0] * len(p) + [1] * len(g.token_ids),
                      logprobs=[0.0] * len(p) + g.logprobs, versions=[-1] * len(p) + g.versions, routed_experts=routed)
        out.append(Trajectory(task_id="t", group_id=f"g{i % 2}", segments=[seg], reward=Reward(value=float(i % 2))))
    return out


@pytest.mark.parametrize("family", list(PRESETS))
def test_batch_invariant_engine_equals_the_trainer_bit_for_bit(models, family):
    model = models[family]
    gen = torch.Generator().manual_seed(2)
    prompts = [[int(t) for t in torch.randint(0, VOCAB, (int(n),), generator=gen)] for n in (5, 70, 33, 12, 90, 8)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=i) for i in range(len(prompts))]

    async def main():
        async with LocalEngine(model, batch_invariant=True, max_seq_len=256) as engine:
            alone = await engine.generate(prompts[0], params[0])
            together = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))
            return alone, together

    alone, together = asyncio.run(main())
    assert alone.token_ids == together[0].token_ids and alone.logprobs == together[0].logprobs
    fwd = BatchInvariantForward(model, 256)
    seqs = [p + g.token_ids for p, g in zip(prompts, together)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        lp = logprobs_from_logits(fwd(ids)[0][:, :-1], ids[:, 1:])
    for i, (p, g) in enumerate(zip(prompts, together)):
        assert lp[i, len(p) - 1:len(p) - 1 + len(g.token_ids)].tolist() == g.logprobs, f"session {i}"
    m = Trainer(copy.deepcopy(model), TrainerConfig(lr=1e-6, micro_batch_tokens=256), batch_invariant=True).step(
        _batch(prompts, together))
    assert m["mismatch/max_abs_diff"] == 0.0
    if family == "qwen3_moe":  # the trainer routed each token to the experts the engine did
        assert m["router_agreement"] == 1.0


def test_outside_the_registry_or_its_limits_the_hf_fallback_says_why(models, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    with caplog.at_level(logging.WARNING, logger="flywheel.modeling.runner"):
        runner = runner_for(gpt2, 64)
    assert isinstance(runner, HFRunner) and isinstance(runner, Runner) and not runner.reuses_prefixes
    assert "'gpt2' is not in the native registry" in caplog.text
    windowed = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                sliding_window=16))
    family, why = native_family(windowed, 64)
    assert family is None and "sliding-window attention (16 tokens)" in why
    assert native_family(windowed, 16)[0] is not None  # a window that covers the context is full attention
    assert isinstance(runner_for(models["llama"], 256), DecoderRunner)
    with pytest.raises(ValueError, match="batch_invariant"):
        runner_for(gpt2, 64, batch_invariant=True)
