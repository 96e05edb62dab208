"""LoRA (trainer.lora): config, adapter-only optimizer, checkpoints, mid-training, adapters synced to the local
engine merged into the pristine base, the served-adapter check, and bitwise engine == trainer log-probs with an
adapter on (batch-invariant mode). The sharded trainer with LoRA: test_lora_sharded.py."""

import asyncio
import copy
import random

import pytest
import torch
from safetensors.torch import load_file

from flywheel.config import LoraConfig, ModelConfig, TrainerConfig, validate
from flywheel.config.base import ConfigError
from flywheel.inference.local import LocalEngine
from flywheel.modeling.lora import merge_lora
from flywheel.policy.model import build_model
from flywheel.trainer import lora
from flywheel.trainer.sft import SFTParams, sft_train
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, SamplingParams, Segment, Trajectory
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import IntegrityError, Publisher, Subscriber

VOCAB = 256
LORA = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def base():
    return build_model(ModelConfig(preset="tiny", num_layers=2, max_seq_len=256, seed=1), vocab_size=VOCAB)


def _batch(seed: int, n: int = 8) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 12))]
        comp = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 9))]
        seg = Segment(token_ids=prompt + comp, loss_mask=[0] * len(prompt) + [1] * len(comp),
                      logprobs=[0.0] * len(prompt) + [-rng.uniform(0.5, 4) for _ in comp],
                      versions=[-1] * len(prompt) + [0] * len(comp))
        out.append(Trajectory(task_id="t", group_id=f"g{i % 2}", segments=[seg], reward=Reward(value=float(i % 3 == 0))))
    return out


def _trainer(base, run_dir=None, **kw) -> Trainer:
    torch.manual_seed(0)
    cfg = TrainerConfig(lr=1e-2, micro_batch_tokens=64, lora=LORA, correction="none")
    return Trainer(copy.deepcopy(base), cfg, run_dir=run_dir, **kw)


def _randomize_b(model) -> None:
    """B starts at zero (the adapter starts as a no-op); give it values so the adapter changes the outputs."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in lora.adapter_parameters(model).items():
            if ".lora_B." in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def test_config_is_off_by_default_and_refuses_bad_keys():
    assert TrainerConfig().lora.rank == 0
    with pytest.raises(ConfigError, match="trainer.lora.target_modules is empty"):
        validate({"trainer": {"lora": {"rank": 8, "target_modules": []}}})
    with pytest.raises(ConfigError, match="trainer.lora.target_modules entries"):
        validate({"trainer": {"lora": {"rank": 8, "target_modules": ["q proj"]}}})
    with pytest.raises(ConfigError, match="trainer.lora"):
        validate({"trainer": {"lora": {"rank": -1}}})
    assert validate({"trainer": {"lora": {"rank": 8, "alpha": 32}}}).trainer.lora.scale == 4.0


def test_targets_that_match_nothing_and_dropout_in_batch_invariant_mode_are_refused(base):
    with pytest.raises(ConfigError, match="match no nn.Linear"):
        lora.apply_lora(copy.deepcopy(base), LoraConfig(rank=2, target_modules=["nope_proj"]))
    cfg = TrainerConfig(lora=LoraConfig(rank=2, dropout=0.1))
    with pytest.raises(ConfigError, match="trainer.lora.dropout"):
        Trainer(copy.deepcopy(base), cfg, batch_invariant=True)


def test_optimizer_holds_only_the_adapter_and_the_base_stays_frozen(base):
    t = _trainer(base)
    adapter = lora.adapter_parameters(t.model)
    in_optimizer = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in adapter.values()} and len(adapter) == 2 * 2 * 7  # 2 layers x 7 linears
    before = {k: v.clone() for k, v in lora.base_state(t.model).items()}
    assert set(before) == set(base.state_dict())  # plain names: what an engine without LoRA holds
    for seed in (1, 2):
        m = t.step(_batch(seed))
        assert m["grad_norm"] > 0
    after = lora.base_state(t.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    published = t.state_dict_for_publish()
    assert set(published) == {f"{n}{s}" for n in lora.lora_layers(t.model) for s in (".lora_A", ".lora_B")}
    assert any(published[k].abs().max() > 0 for k in published if k.endswith(".lora_B"))
    meta = t.publish_meta()
    assert meta is not None and meta["scale"] == 2.0 and meta["base_digest"] == lora.base_digest(t.model)


def test_checkpoint_holds_the_adapter_and_resume_is_bit_exact(base, tmp_path):
    t = _trainer(base, run_dir=tmp_path)
    t.step(_batch(1))
    path = t.save_checkpoint({"pos": 1})
    saved = load_file(str(path / "model.safetensors"))
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)  # adapter only, not the model
    t.step(_batch(2))
    expect = t.state_dict_for_publish()

    again, extra = Trainer.resume(tmp_path, lambda: copy.deepcopy(base))  # a fresh adapter, then the checkpoint's
    assert extra == {"pos": 1} and again.lora is not None and again.version == 1
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in saved.items())
    again.step(_batch(2))
    got = again.state_dict_for_publish()
    assert all(torch.equal(got[k], expect[k]) for k in expect)
    with pytest.raises(ValueError, match="holds full weights but this trainer has trainer.lora.rank = 4"):
        full = Trainer(copy.deepcopy(base), TrainerConfig(), run_dir=tmp_path / "full")
        full.save_checkpoint()
        _trainer(base, run_dir=tmp_path / "full").load_checkpoint()


def test_mid_training_with_lora_trains_adapters_and_folds_them_in(base):
    model = copy.deepcopy(base)
    rng = random.Random(0)
    examples = [([rng.randrange(3, 40) for _ in range(24)], [0] * 4 + [1] * 20) for _ in range(16)]
    m = sft_train(model, examples, SFTParams(lr=2e-2, num_steps=6, batch_tokens=256, lora=LORA))
    assert m["final_loss"] < m["initial_loss"]
    assert m["num_trained_params"] < 0.1 * sum(p.numel() for p in base.parameters())
    assert not lora.has_lora(model) and set(model.state_dict()) == set(base.state_dict())  # a plain model again
    new, old = model.state_dict(), base.state_dict()
    assert torch.equal(new["model.embed_tokens.weight"], old["model.embed_tokens.weight"])  # not a target
    assert not torch.equal(new["model.layers.0.self_attn.q_proj.weight"], old["model.layers.0.self_attn.q_proj.weight"])


def test_engine_merges_from_the_pristine_base_so_swaps_never_drift(base):
    engine = LocalEngine(copy.deepcopy(base))
    w = engine.model.model.layers[0].self_attn.q_proj.weight
    w0 = w.detach().clone()
    t = _trainer(base)
    _randomize_b(t.model)
    v1, meta = t.state_dict_for_publish(), t.publish_meta()
    v2 = {k: v * 1.5 for k, v in v1.items()}
    engine.update_adapter(1, v1, meta)
    first = w.detach().clone()
    a, b = v1["model.layers.0.self_attn.q_proj.lora_A"], v1["model.layers.0.self_attn.q_proj.lora_B"]
    assert torch.equal(first, merge_lora(w0, a, b, meta["scale"])) and not torch.equal(first, w0)
    for _ in range(3):
        engine.update_adapter(2, v2, meta)
        engine.update_adapter(3, v1, meta)
    assert torch.equal(w.detach(), first) and engine.version == 3  # from W0 every time: same bits
    assert set(engine.served_adapter()) == set(v1)
    only_k = {k: v for k, v in v1.items() if ".k_proj." in k}  # q_proj left out: it goes back to W0
    engine.update_adapter(4, only_k, meta)
    assert torch.equal(w.detach(), w0)
    with pytest.raises(ValueError, match="base weights"):
        engine.update_adapter(5, v1, dict(meta, base_digest="0" * 64))
    with pytest.raises(ValueError, match="lora_A / <module>.lora_B pairs"):
        engine.update_adapter(5, {"model.layers.0.self_attn.q_proj.lora_A": a}, meta)
    assert engine.version == 4


class _StaleEngine(LocalEngine):
    """Says it took the update, keeps serving the adapter it had: what the subscriber must catch."""

    def update_adapter(self, version, tensors, meta):
        if self.served_adapter():
            return 0.0
        return super().update_adapter(version, tensors, meta)


def test_subscriber_installs_adapter_deltas_and_refuses_a_stale_engine(base, tmp_path):
    t = _trainer(base)
    store = WeightStore(str(tmp_path / "w"))
    with Publisher(store, anchor_every=10) as pub:
        for v in (1, 2):
            t.step(_batch(v))
            m = pub.publish(v, t.state_dict_for_publish(), adapter=t.publish_meta()).result()
            assert m["adapter"]
    manifest = store.read_manifest(2)
    assert manifest["adapter"]["base_digest"] == lora.base_digest(t.model) and not manifest["anchor"]
    full_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    assert manifest["raw_bytes"] < full_bytes / 10  # the adapter, not the model

    engine = LocalEngine(copy.deepcopy(base))
    sub = Subscriber(store, engine)
    assert sub.poll(target=1) == 1 and sub.poll() == 2 and sub.metrics[-1]["path"] == "delta"
    served = engine.served_adapter()
    assert all(torch.equal(served[k], v) for k, v in t.state_dict_for_publish().items())

    stale = Subscriber(store, _StaleEngine(copy.deepcopy(base)))
    assert stale.poll(target=1) == 1
    with pytest.raises(IntegrityError, match="did not take the update"):
        stale.poll()
    assert stale.version == 1

    other = build_model(ModelConfig(preset="tiny", num_layers=2, max_seq_len=256, seed=2), vocab_size=VOCAB)
    refused = Subscriber(store, LocalEngine(other))
    assert refused.poll() is None and "base weights" in str(refused.last_error)


def _sampled_with_adapter(t: Trainer, base, n: int, attached: bool = False):
    """(prompts, generations, trajectories) of `n` sessions sampled by a batch-invariant engine serving `t`'s
    adapter; `attached`: the engine must hold it unmerged."""
    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(n)]

    async def sample():
        async with LocalEngine(copy.deepcopy(base), batch_invariant=True) as engine:
            engine.update_adapter(1, t.state_dict_for_publish(), t.publish_meta())
            q = engine.model.model.layers[0].self_attn.q_proj
            assert (getattr(q, "_flywheel_lora", None) is not None) == attached
            return await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=6 + i,
                                                                           seed=i)) for i, p in enumerate(prompts)))

    gens = asyncio.run(sample())
    batch = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        seg = Segment(token_ids=p + g.token_ids, loss_mask=[0] * len(p) + [1] * len(g.token_ids),
                      logprobs=[0.0] * len(p) + g.logprobs, versions=[-1] * len(p) + g.versions)
        batch.append(Trajectory(task_id="t", group_id=f"g{i % 2}", segments=[seg], reward=Reward(value=float(i % 2))))
    return prompts, gens, batch


def test_engine_and_trainer_log_probs_are_bit_identical_with_an_adapter(base):
    t = _trainer(base, batch_invariant=True)
    _randomize_b(t.model)
    t.cfg = t.cfg.model_copy(update={"micro_batch_tokens": 96})
    prompts, gens, batch = _sampled_with_adapter(t, base, 8)
    m = t.step(batch)
    assert m["num_micro_batches"] > 1 and m["num_loss_tokens"] > 40
    assert m["mismatch/max_abs_diff"] == 0.0  # every sampled token's log-prob, bit for bit
    for i, (p, g) in enumerate(zip(prompts, gens)):
        assert t.recomputed_logprobs(i)[0][len(p):] == g.logprobs
    # and the adapter really changes the policy: the base model's log-probs differ
    plain = Trainer(copy.deepcopy(base), TrainerConfig(micro_batch_tokens=96, correction="none"), batch_invariant=True)
    assert plain.step(batch)["mismatch/max_abs_diff"] > 1e-4


UNMERGED = LoraConfig(rank=4, alpha=8.0, serve="unmerged")


def test_an_unmerged_adapter_leaves_the_base_and_serves_the_same_policy(base):
    """trainer.lora.serve = "unmerged": the engine's weights stay W0 (the same tensors), each adapted linear adds
    scale (x A^T) B^T; the policy is the merged one up to float rounding, and a merged adapter after it takes the
    factors off again."""
    t = _trainer(base)
    _randomize_b(t.model)
    tensors, meta = t.state_dict_for_publish(), t.publish_meta()
    rng = random.Random(4)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 30))] for _ in range(4)]

    async def logprobs(engine, serve):
        engine.update_adapter(1, tensors, dict(meta, serve=serve))
        gens = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=8, seed=i))
                                      for i, p in enumerate(prompts)))
        return [g.token_ids for g in gens], [g.logprobs for g in gens]

    async def both():
        async with LocalEngine(copy.deepcopy(base)) as engine:
            q = engine.model.model.layers[0].self_attn.q_proj
            w0, ptr = q.weight.detach().clone(), q.weight.data_ptr()
            unmerged = await logprobs(engine, "unmerged")
            assert q.weight.data_ptr() == ptr and torch.equal(q.weight, w0)  # the base untouched
            assert q._flywheel_lora is not None  # the factors beside it
            merged = await logprobs(engine, "merged")
            assert not torch.equal(q.weight, w0) and q._flywheel_lora is None
            await logprobs(engine, "unmerged")  # then full weights: they are the policy, the factors come off
            engine.update_weights(2, {n: t.detach().clone() for n, t in base.state_dict().items()})
            assert q._flywheel_lora is None and engine.served_adapter() == {}
            return unmerged, merged

    (tok_u, lp_u), (tok_m, lp_m) = asyncio.run(both())
    assert tok_u == tok_m  # the same policy: the same samples at these seeds
    assert max(abs(a - b) for x, y in zip(lp_u, lp_m) for a, b in zip(x, y)) < 1e-4
    assert meta["serve"] == "merged" and lora.adapter_meta(t.model, UNMERGED, "d")["serve"] == "unmerged"


def test_unmerged_engine_and_trainer_log_probs_are_bit_identical(base):
    torch.manual_seed(0)
    t = Trainer(copy.deepcopy(base), TrainerConfig(lr=1e-2, micro_batch_tokens=96, lora=UNMERGED, correction="none"),
                batch_invariant=True)
    _randomize_b(t.model)
    _, _, batch = _sampled_with_adapter(t, base, 6, attached=True)
    m = t.step(batch)
    assert m["num_micro_batches"] > 1 and m["mismatch/max_abs_diff"] == 0.0  # bit for bit, unmerged on both sides
