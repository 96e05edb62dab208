"""The Trainer on real tiny transformers models: step semantics, micro-batching, checkpoints and exact
resume, router replay for MoE. Every test takes a second or two on two CPU cores."""

import copy
import math

import pytest
import torch

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model
from flywheel.trainer.checkpoint import latest_checkpoint, list_checkpoints
from flywheel.trainer.replay import moe_routers, record_routing, router_replay
from flywheel.trainer.schedule import warmup_factor
from flywheel.trainer.train import Trainer, pack_micro_batches
from flywheel.types import Reward, Segment, Trajectory

VOCAB = 64


def tiny(preset="tiny", seed=0):
    torch.manual_seed(0)
    return build_model(ModelConfig(preset=preset, seed=seed), vocab_size=VOCAB)


def make_traj(model, prompt, completion, reward, group, *, noise=0.0, version=0, moe=False):
    """A trajectory whose sampler log-probs are the model's own (plus `noise` per sampled token)."""
    ids = list(prompt) + list(completion)
    with torch.no_grad():
        lp = token_logprobs(model, torch.tensor([ids]))[0]
    p = len(prompt)
    logprobs = [0.0] * p + [float(x) + noise for x in lp[p - 1:]]
    routed = None
    if moe:
        with torch.no_grad(), record_routing(model) as rec:
            model(torch.tensor([ids]))
        e = rec.experts()  # [L, layers, k] by input position
        routed = [[] for _ in range(p)] + [e[i - 1].tolist() for i in range(p, len(ids))]
    seg = Segment(token_ids=ids, loss_mask=[0] * p + [1] * len(completion), logprobs=logprobs,
                  versions=[-1] * p + [version] * len(completion), routed_experts=routed)
    return Trajectory(task_id=group, group_id=group, segments=[seg], reward=Reward(value=reward))


def batch(model, noise=0.0, moe=False, n=2):
    g = torch.Generator().manual_seed(1)
    out = []
    for k in range(n):
        prompt = torch.randint(3, VOCAB, (5 + k,), generator=g).tolist()
        for j in range(4):
            comp = torch.randint(3, VOCAB, (3 + j,), generator=g).tolist()
            out.append(make_traj(model, prompt, comp, float(j % 2), f"task{k}", noise=noise, moe=moe))
    return out


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_pack_micro_batches_respects_the_token_budget():
    assert pack_micro_batches([4, 10, 3, 5], 12) == [[1], [3, 0], [2]]
    assert pack_micro_batches([4, 4, 4], 100) == [[0, 1, 2]]
    assert pack_micro_batches([50], 16) == [[0]]  # too long for the budget: alone


def test_step_on_policy_ratio_one_and_weights_move():
    model = tiny()
    before = weights(model)
    trainer = Trainer(model, TrainerConfig(lr=1e-3, correction="tis"))
    m = trainer.step(batch(model))
    assert trainer.version == 1 and m["version"] == 1.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["clip_frac"] == 0.0
    assert m["mismatch/k3"] < 1e-8 and m["mismatch/max_abs_diff"] < 1e-4  # sampler = trainer here
    assert m["is_clip_frac"] == 0.0 and m["num_trajectories"] == 8 and m["num_loss_tokens"] == 2 * (3 + 4 + 5 + 6)
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    pub = trainer.state_dict_for_publish()
    assert pub.keys() == after.keys() and all(torch.equal(pub[k], after[k]) for k in pub)


def test_update_epochs_take_several_optimizer_steps_on_one_batch():
    one, two = tiny(), tiny()
    b = batch(one)
    m1 = Trainer(one, TrainerConfig(lr=1e-2, correction="tis")).step(b)
    t2 = Trainer(two, TrainerConfig(lr=1e-2, correction="tis", update_epochs=2))
    m2 = t2.step(b)
    assert t2.version == 1 and m2["update_epochs"] == 2.0  # one published version per batch
    assert m1["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert abs(m2["ratio_mean"] - 1.0) > 1e-4  # the second epoch scores against the batch's old log-probs
    w1, w2 = weights(one), weights(two)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)  # the second step moved the weights further


def test_warmup_ramps_the_learning_rate_per_optimizer_update():
    model = tiny()
    trainer = Trainer(model, TrainerConfig(lr=1e-2, update_epochs=2, warmup_steps=2))
    lrs = [trainer.step(batch(model))["lr"] for _ in range(3)]  # the last epoch's rate of each step
    assert lrs == pytest.approx([1e-2 * 2 / 4, 1e-2 * 4 / 4, 1e-2])
    assert warmup_factor(0, 4) == 0.25 and warmup_factor(3, 4) == 1.0 and warmup_factor(9, 4) == 1.0
    assert warmup_factor(0, 0) == 1.0
    with pytest.raises(ValueError):
        warmup_factor(-1, 4)


def test_rl_raises_the_probability_of_rewarded_completions():
    model = tiny()
    prompt, good, bad = [5, 6, 7, 8], [20, 21, 22], [40, 41, 42]
    ids = torch.tensor([prompt + good])

    def lp_good():
        with torch.no_grad():
            return float(token_logprobs(model, ids)[0, len(prompt) - 1:].sum())

    start = lp_good()
    trainer = Trainer(model, TrainerConfig(lr=3e-3, advantage="grpo"))
    for _ in range(4):
        b = [make_traj(model, prompt, good, 1.0, "t"), make_traj(model, prompt, bad, 0.0, "t"),
             make_traj(model, prompt, good, 1.0, "t"), make_traj(model, prompt, bad, 0.0, "t")]
        trainer.step(b)
    assert lp_good() > start + 3.0  # log-prob of the rewarded completion rose by > 3 nats


def test_gradient_accumulation_matches_one_big_micro_batch():
    a, b = tiny(), tiny()
    w0 = weights(a)
    data = batch(a, noise=0.05)
    ta = Trainer(a, TrainerConfig(lr=1e-3, micro_batch_tokens=4096, correction="tis_seq", aggregation="seq_mean"))
    tb = Trainer(b, TrainerConfig(lr=1e-3, micro_batch_tokens=16, correction="tis_seq", aggregation="seq_mean"))
    ma, mb = ta.step(data), tb.step(data)
    assert ma["num_micro_batches"] == 1 and mb["num_micro_batches"] == 8
    assert mb["loss"] == pytest.approx(ma["loss"], abs=1e-6)
    assert mb["grad_norm"] == pytest.approx(ma["grad_norm"], rel=1e-4)
    # Adam's first update is ~lr * sign(g): compare the whole update, not params whose g is ~0
    da = torch.cat([(a.state_dict()[k] - w0[k]).flatten() for k in w0])
    db = torch.cat([(b.state_dict()[k] - w0[k]).flatten() for k in w0])
    assert float((da - db).norm() / da.norm()) < 1e-2 and float(da.norm()) > 1e-3


def test_off_policy_noise_shows_in_mismatch_metrics_and_weights():
    model = tiny()
    trainer = Trainer(model, TrainerConfig(correction="icepop", icepop_alpha=0.5, icepop_beta=2.0))
    m = trainer.step(batch(model, noise=-1.0))  # sampler log-probs 1 nat lower: ratio e > beta
    assert m["mismatch/k1"] == pytest.approx(-1.0, abs=1e-4)  # mean of log mu - log pi
    assert m["mismatch/k3"] == pytest.approx(math.e - 1 - 1, abs=1e-3)
    assert m["mismatch/frac_outside_0.5_2"] == 1.0 and m["mismatch/frac_outside_0.2_5"] == 0.0
    assert m["is_mask_frac"] == 1.0 and m["mismatch/icepop_mask_frac"] == 1.0 and m["grad_norm"] == 0.0


def test_bad_trajectories_are_skipped_not_fatal():
    model = tiny()
    trainer = Trainer(model, TrainerConfig())
    good = batch(model, n=1)
    no_reward = copy.deepcopy(good[0])
    no_reward.reward = None
    broken = copy.deepcopy(good[1])
    broken.segments[0].logprobs = broken.segments[0].logprobs[:-1]
    m = trainer.step(good + [no_reward, broken])
    assert m["num_skipped"] == 2 and m["num_trajectories"] == 4 and trainer.version == 1
    m = trainer.step([no_reward, broken])
    assert m["step_skipped"] == 1.0 and trainer.version == 1


def test_kl_to_a_reference_model():
    model = tiny()
    with pytest.raises(ValueError, match="reference model"):
        Trainer(model, TrainerConfig(kl_coef=0.1))
    trainer = Trainer(model, TrainerConfig(lr=3e-3, kl_coef=0.1), ref_model=copy.deepcopy(model))
    assert trainer.step(batch(model))["kl"] == pytest.approx(0.0, abs=1e-7)  # same weights at step 0
    assert trainer.step(batch(model))["kl"] > 1e-6


def test_bf16_autocast_step_keeps_fp32_weights():
    model = tiny()
    trainer = Trainer(model, TrainerConfig(dtype="bfloat16", lr=1e-3))
    m = trainer.step(batch(model))
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert 0 < m["mismatch/max_abs_diff"] < 0.5  # bf16 trainer vs fp32 sampler log-probs differ a little
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_exact_resume_is_bit_identical(tmp_path, preset):
    # warmup still ramping at step 3: the resumed trainer must pick the schedule up where it stopped
    cfg = TrainerConfig(lr=1e-3, checkpoint_every=2, micro_batch_tokens=64, weight_decay=0.01, warmup_steps=4)
    data = [batch(tiny(preset), noise=0.1 * k, moe=preset == "tiny-moe") for k in range(3)]

    straight = tiny(preset)
    t = Trainer(straight, cfg)
    for d in data:
        t.step(d)

    run = tmp_path / "run"
    t1 = Trainer(tiny(preset), cfg, run_dir=run, extra_state_fn=lambda: {"tasks_seen": 16, "note": "x"})
    t1.step(data[0])
    t1.step(data[1])  # checkpoint_every=2: saved here
    assert latest_checkpoint(run / "checkpoints").name == "step_00000002"
    del t1
    t2, extra = Trainer.resume(run, lambda: tiny(preset, seed=99))  # different init, overwritten
    assert extra == {"tasks_seen": 16, "note": "x"} and t2.version == 2
    t2.step(data[2])
    ws, wr = straight.state_dict(), t2.model.state_dict()
    assert all(torch.equal(ws[k], wr[k]) for k in ws), "resumed run diverged from the uninterrupted one"
    so, ro = t.optimizer.state_dict()["state"], t2.optimizer.state_dict()["state"]
    assert all(torch.equal(so[i]["exp_avg_sq"], ro[i]["exp_avg_sq"]) for i in so)


def test_checkpoints_are_atomic_pruned_and_checked(tmp_path):
    model = tiny()
    trainer = Trainer(model, TrainerConfig(keep_checkpoints=2, checkpoint_every=0), run_dir=tmp_path)
    with pytest.raises(ValueError, match="no checkpoint"):
        trainer.load_checkpoint()
    for _ in range(3):
        trainer.step(batch(model, n=1))
        trainer.save_checkpoint({"v": trainer.version})
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["step_00000002", "step_00000003"]
    (tmp_path / "checkpoints" / ".tmp-step_00000009-1").mkdir()  # a crash mid-write leaves only a tmp dir
    (tmp_path / "checkpoints" / "step_00000010").mkdir()  # ... or a dir without state.json
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000003"
    with pytest.raises(TypeError, match="JSON"):
        trainer.save_checkpoint({"bad": object()})
    other = Trainer(tiny("tiny-moe"), TrainerConfig(), run_dir=tmp_path)
    with pytest.raises(ValueError, match="does not fit this model"):
        other.load_checkpoint()
    with pytest.raises(ValueError, match="run_dir"):
        Trainer(tiny(), TrainerConfig()).save_checkpoint({})


# ---------------------------------------------------------------------------------- router replay


def test_replay_own_routing_is_exact_and_foreign_routing_is_used():
    model = tiny("tiny-moe")
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), record_routing(model) as rec:
        free = model(ids).logits
    own = rec.experts().reshape(2, 9, len(moe_routers(model)), 2)
    with torch.no_grad(), router_replay(model, own) as stats:
        replayed = model(ids).logits
    assert stats.agreement == 1.0 and stats.num_replayed == 2 * 9 * 4
    assert torch.allclose(free, replayed, atol=1e-6)

    g = torch.Generator().manual_seed(1)
    foreign = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(2 * 9 * 4)]).reshape(2, 9, 4, 2)
    foreign[1, :3] = -1  # not replayed: own routing
    with torch.no_grad(), record_routing(model) as rec, router_replay(model, foreign) as stats:
        other = model(ids).logits
    used = rec.experts().reshape(2, 9, 4, 2)
    assert torch.equal(used[0], foreign[0]) and torch.equal(used[1, 3:], foreign[1, 3:])
    assert torch.equal(used[1, :3], own[1, :3])  # free positions routed as the model does
    assert stats.agreement < 0.5 and not torch.allclose(free, other, atol=1e-3)
    assert "forward" not in moe_routers(model)[0].__dict__  # unpatched after the context


def test_replay_gate_weights_are_recomputed_and_routers_get_gradients():
    model = tiny("tiny-moe")
    ids = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    experts = torch.tensor([[0, 1]]).expand(7, 4, 2).reshape(1, 7, 4, 2).clone()
    router = moe_routers(model)[0]
    h = torch.randn(7, router.hidden_dim, generator=torch.Generator().manual_seed(3))
    with router_replay(model, experts):
        _, scores, idx = router(h)
    probs = torch.softmax(h @ router.weight.T, dim=-1)
    expected = probs[:, :2] / probs[:, :2].sum(-1, keepdim=True)  # softmax restricted to experts {0, 1}
    assert torch.equal(idx, experts[0, :, 0]) and torch.allclose(scores, expected, atol=1e-6)
    with router_replay(model, experts):
        loss = model(ids).logits.square().mean()
    loss.backward()
    assert all(float(r.weight.grad.abs().sum()) > 0 for r in moe_routers(model))
    with pytest.raises(ValueError, match="layers"):
        with router_replay(model, experts[:, :, :2]):
            pass
    with pytest.raises(ValueError, match="MoE"):
        with router_replay(tiny(), experts):
            pass


def test_moe_trainer_step_replays_the_sampler_routing():
    model = tiny("tiny-moe")
    trainer = Trainer(model, TrainerConfig(lr=1e-3))
    m = trainer.step(batch(model, moe=True))
    assert m["router_agreement"] == 1.0 and m["mismatch/max_abs_diff"] < 1e-4
    # a sampler that routed elsewhere: replay forces its experts, agreement drops, log-probs move
    data = batch(model, moe=True)
    for t in data:
        for s in t.segments:
            s.routed_experts = [[[(e[0] + 3) % 8, (e[1] + 5) % 8] for e in tok] if tok else [] for tok in s.routed_experts]
    m = trainer.step(data)
    assert m["router_agreement"] < 0.5 and m["mismatch/max_abs_diff"] > 1e-3


def test_entropy_and_recomputed_logprobs_of_a_step():
    """The step's `entropy` is the policy's entropy averaged over loss tokens (hand-computed from the logits), and
    `recomputed_logprobs(i)` gives the old log-prob of each sampled token of trajectory i (None elsewhere)."""
    model = tiny()
    trajs = batch(model, noise=0.01)
    skipped = Trajectory(task_id="x", group_id="x", segments=trajs[0].segments)  # no reward: not trained on
    trainer = Trainer(copy.deepcopy(model), TrainerConfig(lr=1e-3))
    assert trainer.recomputed_logprobs(0) is None  # no step yet
    m = trainer.step([skipped] + trajs)
    ent_sum, num = 0.0, 0
    for i, t in enumerate(trajs):
        seg = t.segments[0]
        ids = torch.tensor([seg.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].double()
            lp = torch.log_softmax(logits, -1)
        want = lp.gather(-1, ids[0, 1:, None])[:, 0]
        got, = trainer.recomputed_logprobs(i + 1)
        assert len(got) == len(seg.token_ids)
        for j, (mask, v) in enumerate(zip(seg.loss_mask, got)):
            assert (v is None) == (not mask or j == 0)
            if v is not None:
                assert v == pytest.approx(float(want[j - 1]), abs=1e-5)
                assert abs(v - seg.logprobs[j]) == pytest.approx(0.01, abs=1e-4)  # the noise the sampler had
                ent_sum += float(-(lp[j - 1].exp() * lp[j - 1]).sum())
                num += 1
    assert trainer.recomputed_logprobs(0) is None and trainer.recomputed_logprobs(99) is None
    assert m["entropy"] == pytest.approx(ent_sum / num, rel=1e-5) and 0 < m["entropy"] < math.log(VOCAB)


def test_the_last_checkpoint_exports_as_a_loadable_model(tmp_path):
    """A run stopped by a budget or a signal has no final_model; export_model makes one from its last checkpoint."""
    from transformers import AutoModelForCausalLM

    from flywheel.trainer.checkpoint import export_model, write_checkpoint

    cfg = ModelConfig(preset="tiny", num_layers=2)
    base, trained = build_model(cfg, 300), build_model(cfg, 300)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5)
    base.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "tokenizer.json").write_text("{}")  # travels with the base's other files

    tensors = {k: v.detach().clone() for k, v in trained.state_dict().items()}  # as the trainer writes them
    step = write_checkpoint(tmp_path / "ckpt", 7, tensors, {"state": {}, "param_groups": []}, {})
    out = export_model(tmp_path / "base", step, tmp_path / "out")
    assert (out / "tokenizer.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, p in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    adapter = write_checkpoint(tmp_path / "lora", 7, {"model.layers.0.self_attn.q_proj.lora_A": torch.zeros(2, 4)},
                               {"state": {}, "param_groups": []}, {})
    with pytest.raises(ValueError, match="LoRA adapters only"):
        export_model(tmp_path / "base", adapter, tmp_path / "out2")
