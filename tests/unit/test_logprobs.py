"""Trainer-side log-probs: hand-computed values, temperature, and agreement with the model's own forward."""

import math

import torch

from flywheel.config import ModelConfig
from flywheel.inference.sampling import sample_token, sampling_logprobs
from flywheel.policy.logprobs import logprobs_from_logits, token_logprobs
from flywheel.policy.model import build_model


def test_logprobs_from_logits_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probs 1/4, 3/4
    lp = logprobs_from_logits(logits, torch.tensor([1]))
    assert abs(lp.item() - math.log(0.75)) < 1e-6
    lp_t = logprobs_from_logits(logits, torch.tensor([0]), temperature=0.5)  # probs 1/10, 9/10
    assert abs(lp_t.item() - math.log(0.1)) < 1e-6


def test_token_logprobs_is_shifted_log_softmax_of_the_forward():
    model = build_model(ModelConfig(preset="tiny", max_seq_len=128), vocab_size=2048)
    ids = torch.tensor([[5, 17, 300, 42, 1999, 7]])
    lp = token_logprobs(model, ids)
    with torch.no_grad():
        logits = model(ids).logits[0]
    for t in range(5):
        expected = torch.log_softmax(logits[t], -1)[ids[0, t + 1]]
        assert abs(lp[0, t].item() - expected.item()) < 1e-6
    assert lp.requires_grad  # the trainer differentiates through it


def test_sampling_logprobs_top_p_renormalises_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    lp = sampling_logprobs(logits, temperature=1.0, top_p=0.8)  # nucleus {0, 1}: 0.5 + 0.3 reaches 0.8
    assert torch.allclose(lp[:2].exp(), torch.tensor([0.625, 0.375]), atol=1e-6)
    assert torch.isinf(lp[2:]).all()
    token, logprob = sample_token(logits, 0.0, 1.0)
    assert token == 0 and abs(logprob - math.log(0.5)) < 1e-6
    g = torch.Generator().manual_seed(0)
    draws = [sample_token(logits, 1.0, 0.8, g)[0] for _ in range(400)]
    assert set(draws) == {0, 1} and 0.5 < draws.count(0) / 400 < 0.75
