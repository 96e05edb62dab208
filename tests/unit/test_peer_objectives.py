"""Flywheel's surrogates, KL, aggregations and advantage estimators against the peers' own code.

    make setup        # installs the pinned peers into .venv/peers (Makefile, PEERS), without their dependencies
    .venv/bin/pytest -q tests/unit/test_peer_objectives.py

The same random tensors go through flywheel's function and the peer's; loss and gradient w.r.t. the log-probs
(advantages: the values) must agree to 1e-6. Peers, as installed by `make setup`:

* verl 0.9.1, `verl.trainer.ppo.core_algos`: `compute_policy_loss_vanilla` (dual-clip PPO),
  `compute_policy_loss_gspo` (GSPO-token), `compute_policy_loss_cispo`, `compute_policy_loss_sapo`,
  `kl_penalty(..., "low_var_kl")`, `agg_loss`, and the estimators `compute_grpo_outcome_advantage`,
  `compute_rloo_outcome_advantage`, `compute_reinforce_plus_plus_outcome_advantage`,
  `compute_reinforce_plus_plus_baseline_outcome_advantage`. It imports as installed (its light dependencies
  tensordict, omegaconf, codetiming, orjson, pyvers sit in .venv/peers; ray comes from the dev extra); no stub.
* TRL 1.16.0: the GRPO loss is not a pure function but `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py,
  lines 3020-3297 of the installed file): it is called unbound on a stand-in `self` whose
  `_get_per_token_logps_and_entropies` returns our log-probs, so TRL's own lines compute the loss. Importing
  grpo_trainer needs pandas, datasets and pyarrow (dataset handling and completion logging, not the loss); where
  they are not installed, empty stand-in modules take their place during the import only.

Conventions that differ, each asserted below: verl gives a group of one its raw reward (baseline 0) where flywheel
gives 0 (RLOO, REINFORCE++-baseline); TRL's CISPO cap `epsilon_high` is absolute with no lower bound (flywheel's
clip_eps_high = epsilon_high - 1, clip_eps_low = 1); TRL's Dr.GRPO divides by all rows, flywheel and verl by rows
with a loss token; verl's whitening raises on one token, flywheel returns 0.
"""

import importlib.machinery
import importlib.util
import sys
import types
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flywheel.trainer.advantages import compute_advantages
from flywheel.trainer.losses import aggregation_weights, kl_k3, kl_k3_clamped, policy_loss

PEERS = Path(sys.prefix) / "peers"
TOL = 1e-6


@pytest.fixture(scope="module")
def peers_path():
    if not (PEERS / "verl").is_dir() or not (PEERS / "trl").is_dir():
        pytest.fail(f"the peers are not installed in {PEERS}; run `make setup` (Makefile, PEERS)")
    if str(PEERS) not in sys.path:
        sys.path.append(str(PEERS))  # appended: the venv's own torch, numpy and transformers come first
    return PEERS


@pytest.fixture(scope="module")
def verl(peers_path):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    return SimpleNamespace(algos=core_algos, ActorConfig=ActorConfig, AlgoConfig=AlgoConfig)


class _Placeholder(type):
    def __getattr__(cls, name):
        return cls


def _stand_in(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def attr(key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Placeholder(key, (), {})

    mod.__getattr__ = attr  # type: ignore[method-assign]
    return mod


@pytest.fixture(scope="module")
def trl_trainer(peers_path):
    missing = [n for n in ("pandas", "datasets", "pyarrow") if importlib.util.find_spec(n) is None]
    missing += [f"pyarrow.{sub}" for sub in ("compute", "types") if "pyarrow" in missing]
    for name in missing:
        sys.modules[name] = _stand_in(name)
    try:
        from trl.trainer.grpo_trainer import GRPOTrainer
    finally:
        for name in missing:  # later imports elsewhere see the real state again
            sys.modules.pop(name, None)
    return GRPOTrainer


def actor_config(verl, lo=0.2, hi=0.28, c=3.0, tau_pos=1.0, tau_neg=1.05):
    return verl.ActorConfig(clip_ratio=lo, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, tau_pos=tau_pos,
                            tau_neg=tau_neg, strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4)


def tensors(seed=0, b=6, t=9, spread=0.5, empty_row=True):
    """float64 log-probs (leaf), old log-probs, one advantage per row (alternating signs), a right-padded mask
    of varying lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -2.0 * torch.rand(b, t, generator=g, dtype=torch.float64)
    logprobs = (old + spread * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_(True)
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat((b + 1) // 2)[:b]
    adv = (0.1 + torch.rand(b, generator=g, dtype=torch.float64)) * signs  # both signs, never 0
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    if empty_row:
        lengths[-1] = 0  # a row without loss tokens: no contribution under any aggregation
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    return logprobs, old, adv, mask


def ours(logprobs, old, adv, mask, aggregation, **kw):
    loss, m = policy_loss(logprobs, old, old, adv, mask, correction="none", aggregation=aggregation, **kw)
    return loss, m


def agree(a: torch.Tensor, b: torch.Tensor, wrt: torch.Tensor) -> float:
    """Max abs difference of the two losses and of their gradients w.r.t. `wrt`; asserts it is <= TOL."""
    ga, = torch.autograd.grad(a, wrt, retain_graph=True)
    gb, = torch.autograd.grad(b, wrt, retain_graph=True)
    diff = max(abs(float(a.detach()) - float(b.detach())), float((ga - gb).abs().max()))
    assert diff <= TOL, f"loss {float(a.detach())} vs {float(b.detach())}; grad max diff {float((ga - gb).abs().max())}"
    print(f"max abs diff {diff:.3g}")
    assert float(ga.abs().max()) > 0  # a gradient to compare
    return diff


# ---------------------------------------------------------------- verl: surrogates


def test_dual_clip_matches_verl_vanilla(verl):
    logprobs, old, adv, mask = tensors(spread=1.5)
    cfg = actor_config(verl, 0.2, 0.28, 3.0)
    theirs, met = verl.algos.compute_policy_loss_vanilla(old, logprobs, adv[:, None].expand_as(old), mask,
                                                         "token-mean", cfg)
    mine, m = ours(logprobs, old, adv, mask, "token_mean", loss="dual_clip", clip_eps_low=0.2, clip_eps_high=0.28,
                   clip_ratio_c=3.0)
    assert met["actor/pg_clipfrac_lower"] > 0  # the dual clip is active on some tokens
    agree(mine, theirs, logprobs)


def test_ppo_matches_verl_vanilla_where_the_dual_clip_is_never_reached(verl):
    logprobs, old, adv, mask = tensors(seed=1, spread=0.4)
    cfg = actor_config(verl, 0.2, 0.28, 1e6)
    theirs, met = verl.algos.compute_policy_loss_vanilla(old, logprobs, adv[:, None].expand_as(old), mask,
                                                         "seq-mean-token-mean", cfg)
    mine, m = ours(logprobs, old, adv, mask, "seq_mean", loss="ppo", clip_eps_low=0.2, clip_eps_high=0.28)
    assert m["clip_frac"] > 0 and met["actor/pg_clipfrac"] > 0
    agree(mine, theirs, logprobs)


@pytest.mark.parametrize("loss", ["gspo_token", "gspo"])
@pytest.mark.parametrize("verl_agg,agg", [("seq-mean-token-mean", "seq_mean"), ("token-mean", "token_mean")])
def test_gspo_matches_verl_gspo(verl, loss, verl_agg, agg):
    """verl's `compute_policy_loss_gspo` is GSPO-token; with one advantage per sequence `gspo` (the sequence
    ratio with its own gradient) gives the same loss and gradient under each aggregation."""
    logprobs, old, adv, mask = tensors(seed=2, spread=0.1)
    cfg = actor_config(verl, 0.02, 0.03)
    theirs, met = verl.algos.compute_policy_loss_gspo(old, logprobs, adv[:, None].expand_as(old), mask, verl_agg, cfg)
    mine, m = ours(logprobs, old, adv, mask, agg, loss=loss, gspo_clip_eps_low=0.02, gspo_clip_eps_high=0.03)
    assert 0 < m["clip_frac"] < 0.9  # some sequences clipped, some not
    agree(mine, theirs, logprobs)


def test_cispo_matches_verl_cispo(verl):
    logprobs, old, adv, mask = tensors(seed=3, spread=0.5)
    cfg = actor_config(verl, 0.2, 0.28)
    theirs, met = verl.algos.compute_policy_loss_cispo(old, logprobs, adv[:, None].expand_as(old), mask,
                                                       "token-mean", cfg)
    mine, m = ours(logprobs, old, adv, mask, "token_mean", loss="cispo", clip_eps_low=0.2, clip_eps_high=0.28)
    assert m["clip_frac"] == pytest.approx(met["actor/pg_clipfrac"], abs=1e-6) and m["clip_frac"] > 0
    agree(mine, theirs, logprobs)


def test_sapo_matches_verl_sapo(verl):
    """verl's SAPO always aggregates seq-mean-token-mean (whatever loss_agg_mode says): flywheel's seq_mean."""
    logprobs, old, adv, mask = tensors(seed=4, spread=0.6)
    cfg = actor_config(verl, tau_pos=1.0, tau_neg=1.05)
    theirs, _ = verl.algos.compute_policy_loss_sapo(old, logprobs, adv[:, None].expand_as(old), mask,
                                                    "token-mean", cfg)
    mine, _ = ours(logprobs, old, adv, mask, "seq_mean", loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    agree(mine, theirs, logprobs)
    cfg = actor_config(verl, tau_pos=2.0, tau_neg=5.0)  # other temperatures: the sign-dependent gate
    theirs, _ = verl.algos.compute_policy_loss_sapo(old, logprobs, adv[:, None].expand_as(old), mask,
                                                    "seq-mean-token-mean", cfg)
    mine, _ = ours(logprobs, old, adv, mask, "seq_mean", loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=5.0)
    agree(mine, theirs, logprobs)


def test_k3_clamped_matches_verl_low_var_kl_and_k3_where_no_clamp_bites(verl):
    g = torch.Generator().manual_seed(5)
    logprobs = (-3.0 * torch.rand(4, 8, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = logprobs.detach() + 2.0 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    ref[0, 0], ref[1, 1], ref[2, 2] = logprobs[0, 0] + 30.0, logprobs[1, 1] - 30.0, logprobs[2, 2] + 3.0
    ref[3] = logprobs[3].detach() + 0.3 * torch.randn(8, generator=g, dtype=torch.float64)  # inside every clamp
    theirs = verl.algos.kl_penalty(logprobs, ref, "low_var_kl")
    mine = kl_k3_clamped(logprobs, ref)
    assert float(theirs.detach().max()) == 10.0  # the clamps are exercised: exp(20) - 21 is cut to 10
    agree(mine.sum(), theirs.sum(), logprobs)
    agree((mine * torch.arange(32.0, dtype=torch.float64).view(4, 8)).sum(),
          (theirs * torch.arange(32.0, dtype=torch.float64).view(4, 8)).sum(), logprobs)  # per token
    plain = kl_k3(logprobs, ref)  # unclamped k3 differs exactly where the clamp bites
    assert float(plain[0, 0].detach()) > 1e12 and float((plain - mine).detach().abs()[3].max()) == 0.0


@pytest.mark.parametrize("verl_mode,agg", [("token-mean", "token_mean"), ("seq-mean-token-mean", "seq_mean"),
                                            ("seq-mean-token-sum-norm", "token_sum")])
def test_aggregations_match_verl_agg_loss(verl, verl_mode, agg):
    """Dr.GRPO's length normalisation: flywheel's token_sum is verl's seq-mean-token-sum-norm with
    loss_scale_factor = norm_tokens (a constant divisor per sequence, rows without loss tokens not counted)."""
    g = torch.Generator().manual_seed(6)
    values = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    _, _, _, mask = tensors(seed=6, b=5, t=7)
    theirs = verl.algos.agg_loss(values, mask, verl_mode, loss_scale_factor=64)
    coef = aggregation_weights(mask, agg, norm_tokens=64).to(torch.float64)
    mine = (coef[:, None] * mask * values).sum()
    agree(mine, theirs, values)


# ---------------------------------------------------------------- verl: advantage estimators


def verl_outcome(rewards, lengths, t=10):
    """verl's inputs for outcome rewards: the reward on the last response token, a right-padded mask."""
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()
    scores = torch.zeros(len(rewards), t)
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        scores[i, n - 1] = r
    return scores, mask


REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25, 0.75]
GROUPS = ["a", "a", "a", "b", "b", "b", "b", "c", "c"]
LENGTHS = [3, 10, 7, 1, 4, 9, 2, 6, 5]


@pytest.mark.parametrize("kind,verl_fn,kw", [
    ("grpo", "compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": True}),
    ("drgrpo", "compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
    ("rloo", "compute_rloo_outcome_advantage", {}),
    ("reinforce_pp", "compute_reinforce_plus_plus_outcome_advantage", {}),
    ("reinforce_pp_baseline", "compute_reinforce_plus_plus_baseline_outcome_advantage", {}),
])
def test_advantages_match_verl(verl, kind, verl_fn, kw):
    """REINFORCE++'s statistics are over loss tokens in verl (masked_whiten): flywheel weighs each trajectory
    by its loss tokens (`num_tokens`); verl's discount is 1 (AlgoConfig.gamma), the outcome reward is every
    token's return."""
    scores, mask = verl_outcome(REWARDS, LENGTHS)
    adv, _ = getattr(verl.algos, verl_fn)(token_level_rewards=scores, response_mask=mask, index=np.array(GROUPS),
                                          config=verl.AlgoConfig(), **kw)
    theirs = adv[:, 0]  # constant along each response
    assert float((adv - theirs[:, None] * mask).abs().max()) <= TOL
    mine = compute_advantages(REWARDS, GROUPS, kind, num_tokens=LENGTHS)
    assert float((mine - theirs).abs().max()) <= TOL
    assert float(mine.abs().max()) > 0.1


def test_singleton_group_convention_differs_from_verl(verl):
    """Convention: flywheel gives a group of one A = 0 (no baseline, no signal) and leaves it out of
    REINFORCE++-baseline's batch statistics; verl's baseline for it is 0, so it trains on its raw reward."""
    rewards, groups, lengths = REWARDS + [1.0], GROUPS + ["alone"], LENGTHS + [4]
    scores, mask = verl_outcome(rewards, lengths)
    rloo, _ = verl.algos.compute_rloo_outcome_advantage(scores, mask, np.array(groups))
    assert float(rloo[-1, 0]) == 1.0 and float(compute_advantages(rewards, groups, "rloo")[-1]) == 0.0
    rpb, _ = verl.algos.compute_reinforce_plus_plus_baseline_outcome_advantage(scores, mask, np.array(groups))
    mine = compute_advantages(rewards, groups, "reinforce_pp_baseline", num_tokens=lengths)
    assert float(rpb[-1, 0]) > 1.0 and float(mine[-1]) == 0.0
    without = compute_advantages(REWARDS, GROUPS, "reinforce_pp_baseline", num_tokens=LENGTHS)
    assert float((mine[:-1] - without).abs().max()) == 0.0  # the singleton does not move the others
    one = verl_outcome([1.0], [1])
    with pytest.raises(ValueError):  # verl: a batch of one token has no unbiased variance
        verl.algos.compute_reinforce_plus_plus_outcome_advantage(*one, config=verl.AlgoConfig())
    assert compute_advantages([1.0], ["x"], "reinforce_pp", num_tokens=[1]).tolist() == [0.0]


# ---------------------------------------------------------------- TRL: GRPOTrainer._compute_loss


def trl_loss(trainer_cls, logprobs, old, adv, mask, *, loss_type, level="token", eps_low=0.2, eps_high=0.28,
             beta=0.0, ref=None, max_completion_length=None, tau=(1.0, 1.05)):
    """TRL's own loss lines, run on a stand-in trainer that returns our log-probs for its model forward."""
    b, t = logprobs.shape
    accelerator = SimpleNamespace(gather=lambda x: x, gather_for_metrics=lambda x: x, num_processes=1,
                                  reduce=lambda x, reduction="sum": x, sync_gradients=True)
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logprobs, torch.zeros_like(logprobs), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, sapo_temperature_pos=tau[0], sapo_temperature_neg=tau[1],
                             use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False, model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length or t, _entropy_bonus_enabled=False, accelerator=accelerator,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return trainer_cls._compute_loss(stand_in, None, inputs)


def test_ppo_seq_mean_and_k3_match_trl_grpo(trl_trainer):
    logprobs, old, adv, mask = tensors(seed=7, spread=0.4, empty_row=False)
    ref = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="grpo", beta=0.05, ref=ref)
    mine, m = policy_loss(logprobs, old, old, adv, mask, correction="none", aggregation="seq_mean",
                          ref_logprobs=ref, kl_coef=0.05)
    assert m["clip_frac"] > 0 and m["kl"] > 0
    agree(mine, theirs, logprobs)


def test_gspo_matches_trl_sequence_level(trl_trainer):
    logprobs, old, adv, mask = tensors(seed=9, spread=0.1, empty_row=False)
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="grpo", level="sequence", eps_low=0.02,
                      eps_high=0.03)
    for loss in ("gspo", "gspo_token"):
        mine, m = ours(logprobs, old, adv, mask, "seq_mean", loss=loss, gspo_clip_eps_low=0.02, gspo_clip_eps_high=0.03)
        assert 0 < m["clip_frac"] < 0.9
        agree(mine, theirs, logprobs)


def test_cispo_matches_trl_with_its_absolute_cap(trl_trainer):
    """Convention: TRL clamps the ratio at epsilon_high (absolute, no lower bound): clip_eps_high = cap - 1 and
    clip_eps_low = 1 (the lower bound 0 never binds). Its normaliser is the batch's loss tokens: token_mean."""
    logprobs, old, adv, mask = tensors(seed=10, spread=0.5)
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="cispo", eps_high=1.28)
    mine, m = ours(logprobs, old, adv, mask, "token_mean", loss="cispo", clip_eps_low=1.0, clip_eps_high=0.28)
    assert m["clip_frac"] > 0
    agree(mine, theirs, logprobs)


def test_sapo_matches_trl_sapo(trl_trainer):
    logprobs, old, adv, mask = tensors(seed=11, spread=0.6, empty_row=False)
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="sapo", tau=(1.0, 1.05))
    mine, _ = ours(logprobs, old, adv, mask, "seq_mean", loss="sapo")
    agree(mine, theirs, logprobs)


def test_drgrpo_token_sum_matches_trl_dr_grpo(trl_trainer):
    """Dr.GRPO: TRL divides the token sum by rows x max_completion_length; flywheel's token_sum by sequences with
    a loss token x norm_tokens. Equal when every row has a loss token; with an empty row TRL's is smaller by
    (rows - 1) / rows, asserted."""
    logprobs, old, adv, mask = tensors(seed=12, spread=0.4, empty_row=False)
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="dr_grpo", max_completion_length=256)
    mine, _ = ours(logprobs, old, adv, mask, "token_sum", norm_tokens=256)
    agree(mine, theirs, logprobs)
    mask[-1] = 0.0
    theirs = trl_loss(trl_trainer, logprobs, old, adv, mask, loss_type="dr_grpo", max_completion_length=256)
    mine, _ = ours(logprobs, old, adv, mask, "token_sum", norm_tokens=256)
    b = mask.shape[0]
    assert float(theirs.detach()) == pytest.approx(float(mine.detach()) * (b - 1) / b, abs=1e-9)
