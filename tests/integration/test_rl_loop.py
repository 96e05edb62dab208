"""The RL loop end to end on real parts: a node process with the local engine, sandboxes and grader, the
trainer, the weight store. A stopped run resumes without losing a trainer step or an admitted group.
"""

import json
import threading
from pathlib import Path

import pytest

from flywheel.config import load_config
from flywheel.orchestrator.loop import AdmittedLog, run_rl
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.tasks.synth import generate_tasks
from flywheel.trainer.checkpoint import latest_checkpoint, read_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tokenizer, a random tiny policy and a few tasks (uniform groups are kept so training happens)."""
    root = tmp_path_factory.mktemp("base")
    tok = train_tokenizer(default_corpus(200_000), 512)
    save_tokenizer(tok, root / "tokenizer")
    cfg = load_config(None, ["--model.preset", "tiny"])
    save_model(build_model(cfg.model, len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
               root / "model")
    return root, generate_tasks(6, seed=3, split="train", difficulty="easy")


def config(run_dir: Path, mode: str, num_steps: int, *extra: str):
    return load_config(None, [*extra,
        "--run_dir", str(run_dir), "--orchestrator.mode", mode, "--orchestrator.drop_uniform_groups", "false",
        "--orchestrator.max_staleness", "8", "--env.tools", "core", "--env.sandbox", "local",
        "--rollout.group_size", "2", "--rollout.max_turns", "2", "--rollout.max_new_tokens", "16",
        "--rollout.concurrency", "4", "--trainer.batch_size", "4", "--trainer.num_steps", str(num_steps),
        "--trainer.checkpoint_every", "1", "--trainer.lr", "1e-3"])


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_loop_trains_publishes_and_finishes(base, tmp_path, mode):
    root, tasks = base
    run_dir = tmp_path / mode
    out = run_rl(config(run_dir, mode, 2), run_dir, root / "model", root / "tokenizer", tasks)
    assert out["steps"] == 2 and not out["interrupted"] and steps_logged(run_dir) == [1, 2]
    versions = sorted(p.name for p in (run_dir / "weights" / "versions").iterdir())
    assert versions == ["000000000000.json", "000000000001.json", "000000000002.json"]
    assert (run_dir / "final_model" / "config.json").exists()
    if mode == "sync":  # on-policy: every trained group was produced by the current weights
        assert set(out["staleness_hist"]) == {0}


def test_a_paced_async_run_starts_no_more_groups_than_it_may(base, tmp_path):
    """`max_ahead_batches = 1`: 2 groups in flight + 1 batch of 2 groups may be unretired at once, and
    2 steps retire 4 (nothing is dropped here), so at most 8 groups are ever granted; the run finishes."""
    root, tasks = base
    run_dir = tmp_path / "paced"
    cfg = config(run_dir, "async", 2).model_copy(deep=True)
    cfg.orchestrator.max_ahead_batches = 1
    out = run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    assert out["steps"] == 2 and steps_logged(run_dir) == [1, 2]
    assert 4 <= out["groups_received"] <= out["groups_granted"] <= 8 + out["buffer/env_failures"]


def test_stopped_run_resumes_without_losing_steps_or_trajectories(base, tmp_path):
    root, tasks = base
    run_dir = tmp_path / "resume"
    stop = threading.Event()

    def stop_after_two(record):
        if record["step"] == 2:
            stop.set()  # what Ctrl-C does: finish this step, checkpoint, exit

    first = run_rl(config(run_dir, "async", 4), run_dir, root / "model", root / "tokenizer", tasks,
                   on_step=stop_after_two, stop_event=stop)
    assert first["interrupted"] and first["steps"] == 2
    state = read_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    assert state["version"] == 2
    extra = state["extra"]
    admitted = AdmittedLog(run_dir / "trajectories" / "admitted.jsonl")
    assert extra["num_admitted"] == admitted.count  # every admitted group is on disk
    # Groups admitted but not trained on are named in the checkpoint, to be put back on resume.
    trained_groups = 2 * 4 // 2  # steps * batch_size // group_size
    assert len(extra["waiting"]) == admitted.count - trained_groups
    admitted.close()

    second = run_rl(config(run_dir, "async", 4), run_dir, root / "model", root / "tokenizer", tasks, resume=True)
    assert second["steps"] == 4 and not second["interrupted"]
    assert steps_logged(run_dir) == [1, 2, 3, 4]  # no step lost, none repeated
    assert second["buffer/restored"] == len(extra["waiting"])


def test_engines_that_start_late_give_a_clear_error_and_are_stopped(base, tmp_path):
    import multiprocessing
    import signal

    root, tasks = base
    run_dir = tmp_path / "late"
    handler = signal.getsignal(signal.SIGINT)
    cfg = config(run_dir, "async", 2).model_copy(deep=True)
    cfg.orchestrator.start_timeout_s = 0.5  # a node process needs seconds to import torch and load the model
    with pytest.raises(TimeoutError, match="raise orchestrator.start_timeout_s"):
        run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("flywheel-node")]
    assert signal.getsignal(signal.SIGINT) is handler  # the loop's Ctrl-C handler is gone again
    assert not (run_dir / "final_model").exists()


def test_loop_trains_with_a_two_rank_sharded_trainer(base, tmp_path):
    """`trainer.world_size = 2` on the local backend: the loop drives a torchrun group of two FSDP2 ranks (gloo)
    through the same handle; the weight store gets every version from the ranks' sharded publish."""
    root, tasks = base
    run_dir = tmp_path / "sharded"
    cfg = config(run_dir, "async", 2)
    cfg.trainer.world_size = 2
    out = run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    assert out["steps"] == 2 and not out["interrupted"] and steps_logged(run_dir) == [1, 2]
    versions = sorted(p.name for p in (run_dir / "weights" / "versions").iterdir())
    assert versions == ["000000000000.json", "000000000001.json", "000000000002.json"]
    assert (run_dir / "final_model" / "config.json").exists()
    assert (run_dir / "checkpoints" / "step_00000002" / "dcp").is_dir()  # sharded checkpoints


def test_a_run_without_signal_halts_when_asked(base, tmp_path):
    """A random policy solves nothing: with uniform groups dropped no step can run, and
    `orchestrator.halt_without_signal` ends the run (checkpointed, `rl.halted` says why) instead of waiting."""
    root, tasks = base
    run_dir = tmp_path / "nosignal"
    cfg = config(run_dir, "async", 2).model_copy(deep=True)
    cfg.orchestrator.drop_uniform_groups = True
    cfg.orchestrator.halt_without_signal = 3
    out = run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    assert out["interrupted"] and out["steps"] == 0
    assert out["halted"]["reason"] == "no_signal" and out["halted"]["groups"] >= 3


def test_loop_trains_and_serves_a_lora_adapter(base, tmp_path):
    """trainer.lora: every version the loop publishes is the adapter (its manifest carries the marker and the base's
    digest), the engines install it (the subscriber checks the served adapter's hashes) and the run finishes."""
    root, tasks = base
    run_dir = tmp_path / "lora"
    cfg = config(run_dir, "async", 2).model_copy(deep=True)
    cfg.trainer.lora.rank = 4
    out = run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    assert out["steps"] == 2 and not out["interrupted"]
    manifest = json.loads((run_dir / "weights" / "versions" / "000000000002.json").read_text())
    assert manifest.get("adapter") and all(".lora_" in name for name in manifest["tensors"])


def test_loop_publishes_the_served_form_of_an_nvfp4_engine_and_the_engine_takes_it(base, tmp_path):
    """weights.publish_served: every version carries the decoder matrices as NVFP4 codes and scales, the engine
    installs each one (the subscriber checks what it serves against the trainer's hashes) and the run finishes."""
    root, tasks = base
    run_dir = tmp_path / "served"
    cfg = config(run_dir, "sync", 2, "--inference.weight_dtype", "nvfp4", "--weights.publish_served", "true")
    out = run_rl(cfg, run_dir, root / "model", root / "tokenizer", tasks)
    # sync: step 2 was sampled at version 1, which the engine installed from its served form
    assert out["steps"] == 2 and not out["interrupted"] and out["node/version"] == 1, out
    manifest = json.loads((run_dir / "weights" / "versions" / "000000000002.json").read_text())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert manifest["served_format"] == "nvfp4" and manifest["tensors"][q]["dtype"] == "uint8"
    assert q + "#scales" in manifest["tensors"] and q in manifest["served"]
