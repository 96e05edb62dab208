"""Sequence packing (trainer/packing.py, `trainer.pack_sequences`): the packer, the layout, rows isolated from
their neighbours inside a pack, and a packed Trainer step that scores like the padded one."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from sharded_ranks import batches, model, moe_batch, moe_model, trainer_config  # noqa: E402

from flywheel.policy.logprobs import logprobs_from_logits  # noqa: E402
from flywheel.trainer.packing import pack_by_tokens, packed_layout  # noqa: E402
from flywheel.trainer.train import Trainer  # noqa: E402


def test_pack_by_tokens_first_fit_longest_first():
    assert pack_by_tokens([4, 10, 3, 5], 12) == [[1], [3, 0, 2]]  # 10 | 5 + 4 + 3
    assert pack_by_tokens([6, 6, 6], 12) == [[0, 1], [2]]
    assert pack_by_tokens([50, 2], 16) == [[0], [1]]  # too long for the budget: alone


def test_packed_layout_positions_restart_and_unpack_points_at_each_row():
    ids, pos, unpack = packed_layout([[5, 6, 7], [8, 9]])
    assert ids.tolist() == [[5, 6, 7, 8, 9]] and pos.tolist() == [[0, 1, 2, 0, 1]]
    assert unpack.tolist() == [[0, 1], [3, 3]]  # row 2's second slot is padding (masked by the loss)


def test_a_row_scores_the_same_alone_and_inside_a_pack():
    torch.manual_seed(0)
    m = model()
    rows = [torch.randint(3, 64, (n,)).tolist() for n in (9, 5, 12)]
    ids, pos, unpack = packed_layout(rows)
    with torch.no_grad():
        lp = logprobs_from_logits(m(input_ids=ids, position_ids=pos, use_cache=False).logits[:, :-1], ids[:, 1:])[0, unpack]
        for j, r in enumerate(rows):
            t = torch.tensor([r])
            alone = logprobs_from_logits(m(input_ids=t, use_cache=False).logits[:, :-1], t[:, 1:])[0]
            assert torch.allclose(lp[j, :len(r) - 1], alone, atol=1e-5), j  # a leak would move them by ~0.1


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe-replay"])
def test_a_packed_step_scores_like_the_padded_step(moe):
    make, batch = (moe_model, moe_batch) if moe else (model, lambda: batches()[0])
    padded = Trainer(make(), trainer_config(1, 3)).step(batch())
    packed = Trainer(make(), trainer_config(1, 3).model_copy(update={"pack_sequences": True})).step(batch())
    assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-5)
    assert packed["mismatch/k3"] == pytest.approx(padded["mismatch/k3"], rel=1e-6)  # same old log-probs
    assert packed.get("router_agreement") == padded.get("router_agreement")
    assert packed["num_padded_tokens"] == packed["num_tokens"] < padded["num_padded_tokens"]
