"""The sharded trainer on real 2-rank gloo groups (torchrun, CPU): step equality with one process, exact resume
from a DCP checkpoint, loading it at another world size, and a sharded publish whose manifest equals an unsharded
one. The ranks run tests/unit/sharded_ranks.py; each torchrun takes ~10-25 s here, two runs in all.

Tolerance, stated: a step whose batch packs into one micro-batch per rank is bitwise equal to one process (the
sum of two gradients is commutative, and FSDP's x2 loss scaling and /2 mean are exact). With more micro-batches
per rank the gradient sum runs in another order (per slot over ranks, then over slots) and weights differ by a
few float32 ulps (measured ≤ 1.2e-7 absolute after three steps at lr 1e-3); the test allows 1e-6.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from sharded_ranks import CHUNK_MB, batches, bi_config, engine_batch, model, moe_batch, moe_model, trainer_config  # noqa: E402

from flywheel.trainer.distributed import assign_micro_batches  # noqa: E402
from flywheel.trainer.sharded_checkpoint import is_sharded  # noqa: E402
from flywheel.trainer.train import Trainer  # noqa: E402
from flywheel.types import Trajectory  # noqa: E402
from flywheel.weights.store import WeightStore  # noqa: E402
from flywheel.weights.sync import Publisher, Subscriber  # noqa: E402

SCRIPT = Path(__file__).parent / "sharded_ranks.py"


def torchrun(phase: str, out: Path, timeout_s: float = 300) -> None:
    """Two ranks under torchrun (free port: --standalone); the whole process group is killed on a timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           phase, str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parent))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
    assert proc.returncode == 0, f"torchrun {phase} failed ({proc.returncode}):\n{log[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    torchrun("train", out)
    single = Trainer(model(), trainer_config(1, 1), run_dir=out / "single_run")  # for the 1 -> 2 ranks load
    single.step(batches()[0])
    single.save_checkpoint({"data_position": 1})
    (out / "bi_batch.json").write_text(json.dumps([t.to_dict() for t in engine_batch()]))
    torchrun("resume", out)
    return out


def records(out: Path, phase: str) -> list[list[dict]]:
    return json.loads((out / f"{phase}.json").read_text())


def test_assign_micro_batches_balances_tokens_and_is_deterministic():
    assert assign_micro_batches([10, 40, 30, 20], 2) == [[0, 1], [2, 3]]  # 40 | 30, 20 | 10 -> least loaded
    dealt = assign_micro_batches([10, 40, 30, 20], 2)
    loads = [sum([10, 40, 30, 20][i] for i in d) for d in dealt]
    assert loads == [50, 50] and all(d == sorted(d) for d in dealt)
    assert assign_micro_batches([5, 5, 5], 2) == [[0, 2], [1]]  # one rank runs a filler
    assert assign_micro_batches([7], 3) == [[0], [], []]


def test_two_ranks_step_like_one_process(runs):
    single = Trainer(model(), trainer_config(1, 1))
    two = records(runs, "train")
    for step, batch in enumerate(batches()):
        single.cfg = trainer_config(1, step + 1)
        m1 = single.step(batch)
        m2 = two[0][step]["metrics"]
        w2 = load_file(runs / f"train_weights_{step + 1}.safetensors")
        w1 = single.model.state_dict()
        assert w2.keys() == w1.keys()
        diff = max(float((w1[k] - w2[k]).abs().max()) for k in w2)
        if step == 0:  # one micro-batch per rank: bitwise
            assert m2["num_micro_batches"] == 2.0 and diff == 0.0
            assert all(torch.equal(w1[k], w2[k]) for k in w2)
        assert diff <= 1e-6, f"step {step + 1}: weights differ by {diff}"
        assert any(not torch.equal(w1[k], model().state_dict()[k]) for k in w1)  # they did move
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-8)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-6)
        for k in ("num_tokens", "num_loss_tokens", "num_micro_batches", "num_rows", "is_weight_mean"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-6), k
    assert two[0][1]["metrics"]["num_micro_batches"] == 3.0  # odd: rank 1 ran a zero-weight filler


def test_router_replay_sharded_matches_one_process(runs):
    """tiny-moe, the sampler's routing replayed: agreement and weights after a step as in one process."""
    single = Trainer(moe_model(), trainer_config(1, 1))
    m1 = single.step(moe_batch())
    m2 = next(r for r in records(runs, "resume")[0] if r.get("moe"))["metrics"]
    assert 0.5 < m1["router_agreement"] < 1.0  # the replay overrides some of the trainer's own choices
    assert m2["router_agreement"] == m1["router_agreement"]
    assert m2["num_micro_batches"] == 2.0 and m2["loss"] == pytest.approx(m1["loss"], rel=1e-6)
    w2 = load_file(runs / "moe_weights_1.safetensors")
    w1 = single.model.state_dict()
    assert all(torch.equal(w1[k], w2[k]) for k in w2)


def test_packed_sequences_sharded_match_one_process(runs):
    cfg = trainer_config(1, 1).model_copy(update={"pack_sequences": True})
    single = Trainer(model(), cfg)
    m1 = single.step(batches()[0])
    m2 = next(r for r in records(runs, "resume")[0] if r.get("packed"))["metrics"]
    assert m2["num_micro_batches"] == 2.0 and m2["num_padded_tokens"] == m2["num_tokens"]
    assert m2["loss"] == m1["loss"]
    w2 = load_file(runs / "packed_weights_1.safetensors")
    assert all(torch.equal(single.model.state_dict()[k], w2[k]) for k in w2)


def test_batch_invariant_two_ranks_reproduce_the_engines_logprobs_bitwise(runs):
    """numerics.batch_invariant with trainer.world_size = 2: each rank recomputes the log-probs of its own
    micro-batch with FSDP-gathered weights, and every sampled token's log-prob equals the engine's bit for bit;
    the step's weights equal a one-process batch-invariant step's bit for bit (one micro-batch per rank)."""
    batch = json.loads((runs / "bi_batch.json").read_text())
    recomputed = json.loads((runs / "bi_recomputed.json").read_text())
    m2 = next(r for r in records(runs, "resume")[0] if r.get("batch_invariant"))["metrics"]
    assert m2["num_micro_batches"] == 2.0  # one per rank: the rows were split across the two ranks
    assert m2["mismatch/max_abs_diff"] == 0.0 and m2["mismatch/k3"] == 0.0 and m2["entropy"] > 0
    num_tokens = 0
    for traj, lps in zip(batch, recomputed):
        seg, = traj["segments"]
        for i, (m, lp) in enumerate(zip(seg["loss_mask"], lps[0])):
            assert (lp is None) == (not m or i == 0)
            if m:
                assert lp == seg["logprobs"][i], f"token {i} of {traj['group_id']}: {lp} != {seg['logprobs'][i]}"
                num_tokens += 1
    assert num_tokens == sum(sum(t["segments"][0]["loss_mask"]) for t in batch) > 50
    single = Trainer(model(), bi_config(1), batch_invariant=True)
    m1 = single.step([Trajectory.from_dict(t) for t in batch])
    assert m1["mismatch/max_abs_diff"] == 0.0 and m2["loss"] == m1["loss"] and m2["entropy"] == m1["entropy"]
    w2 = load_file(runs / "bi_weights_1.safetensors")
    assert all(torch.equal(single.model.state_dict()[k], w2[k]) for k in w2)
    assert any(not torch.equal(w2[k], model().state_dict()[k]) for k in w2)  # it did train


def test_activation_checkpointing_changes_no_bit(runs):
    with_ac = load_file(runs / "ac_weights_1.safetensors")
    without = load_file(runs / "train_weights_1.safetensors")
    assert all(torch.equal(with_ac[k], without[k]) for k in without)


def test_each_rank_holds_half_of_the_state(runs):
    r0, r1 = (r[0]["state_bytes"] for r in records(runs, "train"))
    whole = sum(p.numel() * 4 for p in {id(p): p for p in model().parameters()}.values())
    assert r0["param_bytes"] + r1["param_bytes"] == whole
    assert max(r0["param_bytes"], r1["param_bytes"]) <= 0.51 * whole
    assert r0["optimizer_bytes"] <= 2 * 0.51 * whole + 64  # AdamW: two moments per local element, a step count


def test_resume_from_a_sharded_checkpoint_is_bitwise(runs):
    ckpt = runs / "run" / "checkpoints" / "step_00000002"
    assert is_sharded(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["extra"] == {"admitted": ["s0g0", "s1g1"], "data_position": 2} and state["world_size"] == 2
    resumed = load_file(runs / "resume_weights_3.safetensors")
    straight = load_file(runs / "train_weights_3.safetensors")
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert records(runs, "resume")[0][0]["metrics"]["loss"] == records(runs, "train")[0][2]["metrics"]["loss"]
    assert records(runs, "resume")[0][0]["version"] == 3


def test_a_two_rank_checkpoint_loads_into_one_process(runs, tmp_path):
    trainer = Trainer(model(), trainer_config(1, 3), run_dir=runs / "run")
    extra = trainer.load_checkpoint()
    assert extra["data_position"] == 2 and trainer.version == 2
    saved = load_file(runs / "train_weights_2.safetensors")
    assert all(torch.equal(trainer.model.state_dict()[k], saved[k]) for k in saved)
    m = trainer.step(batches()[2])  # the optimizer state came along: the next step matches the 2-rank one
    after = load_file(runs / "train_weights_3.safetensors")
    diff = max(float((trainer.model.state_dict()[k] - after[k]).abs().max()) for k in after)
    assert diff <= 1e-6 and m["loss"] == pytest.approx(records(runs, "train")[0][2]["metrics"]["loss"], rel=1e-5)


def test_a_single_process_checkpoint_loads_into_two_ranks(runs):
    single = Trainer(model(), trainer_config(1, 1), run_dir=runs / "single_run")
    single.load_checkpoint()
    single.cfg = trainer_config(1, 2)
    single.step(batches()[1])
    grown = load_file(runs / "grown_weights_2.safetensors")
    w = single.model.state_dict()
    diff = max(float((w[k] - grown[k]).abs().max()) for k in grown)
    assert diff <= 1e-6, f"weights differ by {diff} after the grown group's step"


def _strip(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k != "created_s"}


def test_sharded_publish_writes_the_manifest_of_an_unsharded_publish(runs, tmp_path):
    sharded = WeightStore(str(runs / "store_train"))
    assert sharded.list_versions() == [1, 2, 3]
    pub = Publisher(WeightStore(str(tmp_path / "plain")), anchor_every=2, chunk_mb=CHUNK_MB, dtype="bfloat16")
    for v in (1, 2, 3):
        pub.publish(v, load_file(runs / f"train_weights_{v}.safetensors"))
    pub.close()
    plain = WeightStore(str(tmp_path / "plain"))
    chunked = 0
    for v in (1, 2, 3):
        a, b = _strip(sharded.read_manifest(v)), _strip(plain.read_manifest(v))
        assert a == b, f"version {v}: sharded and unsharded manifests differ"
        chunked += sum(len(t["full"] or t["delta"]) > 1 for t in a["tensors"].values())
    assert chunked > 0  # chunked tensors, so shard boundaries fall inside chunks
    pub_metrics = records(runs, "train")[0][2]["publish"]
    whole = sum(2 * p.numel() for p in {id(p): p for p in model().parameters()}.values())  # bf16
    assert 0 < pub_metrics["exchange_bytes"] < 0.05 * whole  # boundary pieces only, never a gather
    sub = Subscriber(str(runs / "store_train"))
    assert sub.poll() == 3
    want = load_file(runs / "train_weights_3.safetensors")
    assert all(torch.equal(sub.tensors[k], want[k].to(torch.bfloat16)) for k in want)
    sub.close()
