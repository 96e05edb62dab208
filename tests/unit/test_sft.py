"""Mid-training (SFT) on a tiny real model: it learns a deterministic pattern from mask-1 tokens only."""

import pytest
import torch

from flywheel.config import ModelConfig
from flywheel.policy.model import build_model
from flywheel.trainer.sft import SFTParams, lr_at, sft_train

BOS, EOS = 1, 2


def counting_examples():
    """Prompt [BOS, 7, x]; response [x+1, x+2, x+3, EOS] (loss on the response only)."""
    out = []
    for x in range(10, 42):
        ids = [BOS, 7, x, x + 1, x + 2, x + 3, EOS]
        out.append((ids, [0, 0, 0, 1, 1, 1, 1]))
    return out


def greedy(model, prompt, num_tokens):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_sft_learns_a_deterministic_pattern():
    model = build_model(ModelConfig(preset="tiny", seed=0), vocab_size=64)
    seen = []
    m = sft_train(model, counting_examples(), SFTParams(lr=5e-3, num_steps=30, batch_tokens=256, warmup_steps=3,
                                                        seed=0),
                  progress=lambda step, n, mm: seen.append((step, n, mm["loss"])))
    assert m["num_steps"] == 30 and seen[-1][:2] == (30, 30)
    assert m["initial_loss"] > 3.5 and m["final_loss"] < m["initial_loss"] / 20  # ln(64) = 4.16 at the start
    assert m["num_loss_tokens"] == 30 * 32 * 4  # one batch of all 32 examples per step, 4 loss tokens each
    wrong = [x for x in range(10, 42) if greedy(model, [BOS, 7, x], 4) != [x + 1, x + 2, x + 3, EOS]]
    assert len(wrong) <= 1, wrong


def test_loss_only_on_mask_one_tokens():
    # the prompt token after BOS is random noise; with mask 0 it must not be learned
    g = torch.Generator().manual_seed(0)
    examples = [([BOS, int(torch.randint(20, 60, (1,), generator=g)), 5, 6], [0, 0, 1, 1]) for _ in range(16)]
    model = build_model(ModelConfig(preset="tiny", seed=1), vocab_size=64)
    sft_train(model, examples, SFTParams(lr=5e-3, num_steps=25, batch_tokens=64))
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([[BOS, 30, 5]])).logits[0], -1)
    assert float(p[2, 6]) > 0.9  # the masked-in target is learned
    assert float(p[1, 5]) > 0.9  # ... and so is 5 after the random token (a mask-1 target)
    assert float(p[0, 20:60].max()) < 0.1  # the masked-out random prompt token is not predicted


def test_schedule_and_bad_input():
    p = SFTParams(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [round(lr_at(s, 14, p), 4) for s in (0, 3, 4, 9, 14)] == [0.25, 1.0, 1.0, 0.55, 0.1]
    model = build_model(ModelConfig(preset="tiny"), vocab_size=64)
    with pytest.raises(ValueError, match="mask entries"):
        sft_train(model, [([1, 2, 3], [0, 1])])
    with pytest.raises(ValueError, match="no example has a loss token"):
        sft_train(model, [([1, 2, 3], [1, 0, 0])])
    with pytest.raises(TypeError, match="pair"):
        sft_train(model, [[1, 2, 3]])
    with pytest.raises(ValueError, match="num_epochs"):
        sft_train(model, counting_examples(), SFTParams(num_epochs=0, num_steps=0))
