"""The LM head at scored positions only (trainer/scored.py): the positions, the scatter back, and a Trainer step
that computes the head on fewer rows and gives the loss, the metrics and the gradients of the full head."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from sharded_ranks import batches, model, trainer_config  # noqa: E402

from flywheel.policy.logprobs import entropy_from_logits, logprobs_from_logits  # noqa: E402
from flywheel.trainer.packing import packed_layout  # noqa: E402
from flywheel.trainer.scored import keeps_logits, scored_positions, target_logprobs  # noqa: E402
from flywheel.trainer.train import Trainer  # noqa: E402


def test_scored_positions_padded_and_packed():
    masks = [[0, 0, 1, 1], [0, 1, 0]]
    assert scored_positions(masks).tolist() == [1, 2, 3]  # the union over rows
    _, _, unpack = packed_layout([[5, 6, 7, 8, 9], [1, 2, 3, 4]])  # rows start at 0 and 5
    assert scored_positions(masks, unpack).tolist() == [2, 3, 6]
    assert scored_positions([[0, 0]]).tolist() == [0]  # nothing scored: one position, so the head still runs


def test_target_logprobs_at_kept_positions_equal_the_full_ones_and_are_zero_elsewhere():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 11, (2, 6))
    keep = torch.tensor([1, 4])
    lp, ent = target_logprobs(logits[:, keep], ids, keep, 0.7, entropy=True)
    full = logprobs_from_logits(logits[:, :-1], ids[:, 1:], 0.7)
    full_ent = entropy_from_logits(logits[:, :-1], 0.7)
    assert lp.shape == ent.shape == (2, 5)
    assert torch.equal(lp[:, keep], full[:, keep]) and torch.equal(ent[:, keep], full_ent[:, keep])
    others = [0, 2, 3]
    assert not lp[:, others].any() and not ent[:, others].any()
    lp_all, ent_all = target_logprobs(logits, ids, None, 0.7, entropy=True)
    assert torch.equal(lp_all, full) and torch.equal(ent_all, full_ent)


def test_keeps_logits_reads_the_forward_signature():
    assert keeps_logits(model())
    assert not keeps_logits(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_step_with_the_head_at_scored_positions_equals_the_full_head(packed):
    cfg = trainer_config(1, 3).model_copy(update={"pack_sequences": packed})
    rows_seen: dict[str, list[int]] = {"kept": [], "full": []}
    results, grads = {}, {}
    for arm in ("kept", "full"):
        torch.manual_seed(0)
        trainer = Trainer(model(), cfg)
        assert trainer._keep
        trainer._keep = arm == "kept"
        hook = trainer.model.lm_head.register_forward_hook(
            lambda mod, args, out, arm=arm: rows_seen[arm].append(args[0].shape[0] * args[0].shape[1]))
        captured = {}
        step = trainer.optimizer.step

        def capture(*a, step=step, trainer=trainer, captured=captured, **k):
            captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
            return step(*a, **k)
        trainer.optimizer.step = capture
        results[arm] = trainer.step(batches()[0])
        grads[arm] = captured
        hook.remove()
    assert sum(rows_seen["kept"]) < 0.6 * sum(rows_seen["full"])  # the head really ran on fewer rows
    for key in ("loss", "pg_loss", "mismatch/k3", "mismatch/max_abs_diff", "entropy", "clip_frac"):
        if key in results["full"]:
            assert results["kept"][key] == pytest.approx(results["full"][key], rel=1e-5, abs=1e-7), key
    assert grads["kept"].keys() == grads["full"].keys() and grads["full"]
    for name, g in grads["full"].items():
        assert torch.allclose(grads["kept"][name], g, rtol=1e-4, atol=1e-6), name
