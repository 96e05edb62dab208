"""Every `trainer.loss`, `trainer.advantage` and `trainer.kl_estimator` choice through one Trainer step on a tiny
model: the step runs, the weights move, and the step used the configured choice (not the default).

The math itself is tested in test_losses.py / test_advantages.py (hand-computed values) and against verl and TRL
in test_peer_objectives.py. Each step takes about a second on two CPU cores.
"""

import math

import pytest
import torch

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model
from flywheel.trainer.advantages import compute_advantages
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, Segment, Trajectory

VOCAB = 64


def tiny(seed=0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(preset="tiny", seed=seed), vocab_size=VOCAB)


def make_batch(model, rewards=(1.0, 0.0, 0.5, 0.0)):
    """Two groups of four single-segment trajectories, completions of 3 to 6 tokens, sampler = the model."""
    g = torch.Generator().manual_seed(1)
    out = []
    for k in range(2):
        prompt = torch.randint(3, VOCAB, (5 + k,), generator=g).tolist()
        for j, reward in enumerate(rewards):
            ids = prompt + torch.randint(3, VOCAB, (3 + j,), generator=g).tolist()
            with torch.no_grad():
                lp = token_logprobs(model, torch.tensor([ids]))[0]
            p = len(prompt)
            seg = Segment(token_ids=ids, loss_mask=[0] * p + [1] * (len(ids) - p),
                          logprobs=[0.0] * p + [float(x) for x in lp[p - 1:]], versions=[-1] * p + [0] * (len(ids) - p))
            out.append(Trajectory(task_id=f"t{k}", group_id=f"t{k}", segments=[seg],
                                  reward=Reward(value=reward + 0.25 * k)))
    return out


def step(cfg: TrainerConfig, ref_model=None):
    model = tiny()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = make_batch(model)
    m = Trainer(model, cfg, ref_model=ref_model).step(b)
    after = model.state_dict()
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    return m, moved, after, b


@pytest.mark.parametrize("loss", ["ppo", "dual_clip", "gspo", "gspo_token", "cispo", "sapo"])
def test_one_step_with_each_loss_moves_the_weights(loss):
    m, moved, _, _ = step(TrainerConfig(lr=1e-3, loss=loss))
    assert moved > 0 and math.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_the_configured_loss_is_the_one_applied():
    """On the first epoch pi_theta = pi_old: CISPO's value carries log pi (-A log pi per token) and SAPO's the gate
    value 2 / tau at r = 1 (-2A), so their loss differs from PPO's (-A); GSPO's tiny clip (3e-4) holds the second
    epoch's sequence ratios where PPO's 0.2 does not, so its weights end elsewhere."""
    base, _, w_ppo, _ = step(TrainerConfig(lr=1e-2, loss="ppo", update_epochs=2))
    for loss in ("cispo", "sapo"):
        m, _, _, _ = step(TrainerConfig(lr=1e-2, loss=loss, update_epochs=2))
        assert abs(m["loss"] - base["loss"]) > 1e-4, loss
    m, _, w_gspo, _ = step(TrainerConfig(lr=1e-2, loss="gspo", update_epochs=2))
    assert m["clip_frac"] > 0
    assert max(float((w_gspo[k] - w_ppo[k]).abs().max()) for k in w_ppo) > 1e-5


@pytest.mark.parametrize("kind", ["grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_one_step_with_each_advantage_moves_the_weights_and_uses_it(kind):
    m, moved, _, b = step(TrainerConfig(lr=1e-3, advantage=kind))
    assert moved > 0 and math.isfinite(m["loss"])
    rewards, groups = [t.graded.value for t in b], [t.group_id for t in b]
    tokens = [sum(t.segments[0].loss_mask[1:]) for t in b]  # loss tokens per trajectory, as the step counts them
    expected = compute_advantages(rewards, groups, kind, num_tokens=tokens)
    assert m["advantage_abs_mean"] == pytest.approx(float(expected.abs().mean()), abs=1e-6)
    if kind.startswith("reinforce_pp"):  # the step weighs the statistics by loss tokens, not per trajectory
        unweighted = compute_advantages(rewards, groups, kind)
        assert abs(float(unweighted.abs().mean()) - m["advantage_abs_mean"]) > 1e-4


@pytest.mark.parametrize("estimator", ["k3", "k3_clamp"])
def test_one_step_with_each_kl_estimator_moves_the_weights(estimator):
    m, moved, _, _ = step(TrainerConfig(lr=1e-3, kl_coef=0.1, kl_estimator=estimator), ref_model=tiny(seed=1))
    assert moved > 0 and m["kl"] > 0 and math.isfinite(m["loss"])
