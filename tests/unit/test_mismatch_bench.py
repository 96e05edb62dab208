"""The mismatch benchmark's trained-MoE setup: the synthetic corpus follows its bigram chains and a few
training steps really train the tiny MoE (what makes its routers non-trivial for the router-replay k3)."""

import itertools

import torch

from flywheel.bench.mismatch import synthetic_text, train_on_synthetic
from flywheel.config import ModelConfig
from flywheel.policy.model import build_model


def test_synthetic_text_is_seeded_and_follows_few_successors():
    a = synthetic_text(64, 40, torch.Generator().manual_seed(0))
    b = synthetic_text(64, 40, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and int(a.max()) < 512
    successors: dict[int, set[int]] = {}
    for row in a.tolist():
        for x, y in itertools.pairwise(row):
            successors.setdefault(x, set()).add(y)
    # 4 topics x 3 successors: a token never has more than 12 distinct successors (uniform text would have ~40)
    assert max(len(s) for s in successors.values()) <= 12


def test_train_moe_lowers_the_loss():
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny-moe", max_seq_len=128), vocab_size=2048)
    before = [p.detach().clone() for p in model.parameters()]
    losses = train_on_synthetic(model, num_steps=12)
    assert losses[0] > 7.5 and sum(losses[-3:]) / 3 < losses[0] - 0.5  # ln 2048 = 7.62 -> learns the 512 tokens
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
