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


def _full_sort_nucleus(lp: torch.Tensor, top_p: float) -> set[int]:
    sorted_lp, order = torch.sort(lp, descending=True)
    probs = sorted_lp.exp()
    return set(order[(torch.cumsum(probs, 0) - probs) < top_p].tolist()) | {int(order[0])}


def test_the_nucleus_found_among_candidates_is_the_full_sorts_at_every_sharpness():
    g = torch.Generator().manual_seed(0)
    for scale in (0.5, 2.0, 4.0, 8.0, 30.0):  # flat (whole-vocabulary sort) to one token
        logits = torch.randn(5000, generator=g) * scale
        for top_p in (0.5, 0.9, 0.99):
            lp = sampling_logprobs(logits, 1.0, top_p)
            kept = set(torch.nonzero(lp > float("-inf")).flatten().tolist())
            assert kept == _full_sort_nucleus(torch.log_softmax(logits, -1), top_p)
            assert abs(float(torch.logsumexp(lp, 0))) < 1e-5  # renormalised over the nucleus


def test_draws_follow_the_distribution_and_never_pick_a_token_without_mass():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0]))
    g = torch.Generator().manual_seed(1)
    n = 4000
    draws = [sample_token(logits, 1.0, 1.0, g) for _ in range(n)]
    counts = [sum(t == i for t, _ in draws) / n for i in range(5)]
    assert counts[4] == 0
    assert all(abs(c - p) < 0.03 for c, p in zip(counts, (0.4, 0.3, 0.2, 0.1)))
    assert all(abs(lp - math.log((0.4, 0.3, 0.2, 0.1)[t])) < 1e-6 for t, lp in draws)
    a = [sample_token(logits, 0.7, 0.9, torch.Generator().manual_seed(5))[0] for _ in range(3)]
    assert len(set(a)) == 1  # the same generator state, the same token
