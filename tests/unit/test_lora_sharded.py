"""LoRA on the sharded trainer: 2 gloo ranks under torchrun (CPU) against one process, exact resume from a sharded
checkpoint, and a sharded publish of each adapter version that a local engine then installs. This file is also the
ranks' script:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/unit/test_lora_sharded.py OUT

Each rank seeds torch differently before `shard_model` applies trainer.lora: the adapter's init draws from its own
generator (trainer.seed), so every rank and the single process of the test still start from the same adapter.
Two steps (step 1 packs into one micro-batch per rank, step 2 into three, see sharded_ranks.py), a sharded
checkpoint after step 1, the published adapter after each step; then a fresh group
loads the checkpoint and takes step 2 again. Tolerance as in test_sharded_trainer.py: 1e-6 against one process
(the gradient sum over ranks runs in another order), bitwise for the resume. One torchrun, 30-50 s on a busy
2-core machine, so it is marked `long` (`make test-long`).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
from sharded_ranks import batches, model, trainer_config  # noqa: E402

from flywheel.config import LoraConfig, TrainerConfig  # noqa: E402
from flywheel.inference.local import LocalEngine  # noqa: E402
from flywheel.trainer.train import Trainer  # noqa: E402
from flywheel.weights.sync import Subscriber  # noqa: E402

LORA = LoraConfig(rank=4, alpha=8.0)


def lora_config(world_size: int, step: int) -> TrainerConfig:
    return trainer_config(world_size, step).model_copy(update={"lora": LORA})


def _ranks(out: Path) -> None:
    from flywheel.trainer.distributed import init_group, leave_group, shard_model
    from flywheel.weights.sharded import ShardedPublisher

    group = init_group(lora_config(2, 1))

    def trainer(step: int) -> Trainer:
        torch.manual_seed(group.rank)  # the adapter's init must not depend on it (apply_lora seeds its own)
        return Trainer(shard_model(model(), group, lora_config(2, step)), lora_config(2, step), run_dir=out / "run",
                       group=group)

    t = trainer(1)
    pub = ShardedPublisher(str(out / "weights"), group, chunk_mb=0.004, num_threads=1)
    for step in (1, 2):
        t.cfg = lora_config(2, step)
        t.step(batches()[step - 1])
        adapter = t.state_dict_for_publish()  # a collective: every rank gathers the full adapter
        pub.publish(step, adapter, adapter=t.publish_meta())
        if group.is_main:
            save_file(adapter, str(out / f"adapter_{step}.safetensors"))
        if step == 1:
            t.save_checkpoint({"step": 1})
    again = trainer(2)
    assert again.load_checkpoint()["step"] == 1
    again.step(batches()[1])
    pub.close()
    adapter = again.state_dict_for_publish()
    if group.is_main:
        save_file(adapter, str(out / "adapter_resumed.safetensors"))
        (out / "optimizer_params.txt").write_text(str(sum(len(g["params"]) for g in t.optimizer.param_groups)))
    leave_group(group)


@pytest.mark.long  # ~30-50 s on a busy 2-core machine: over the default tier's per-file budget
def test_lora_sharded_matches_one_process_and_resumes_exactly(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
           str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{log[-4000:]}"

    single = Trainer(model(), lora_config(1, 1))
    num_adapter = len(single.params)
    assert int((tmp_path / "optimizer_params.txt").read_text()) == num_adapter  # the adapters only, sharded too
    for step in (1, 2):
        single.cfg = lora_config(1, step)
        single.step(batches()[step - 1])
        mine = single.state_dict_for_publish()
        theirs = load_file(str(tmp_path / f"adapter_{step}.safetensors"))
        assert set(mine) == set(theirs) and len(mine) == num_adapter
        worst = max((mine[k] - theirs[k]).abs().max().item() for k in mine)
        assert worst <= 1e-6, f"step {step}: sharded adapter differs from one process by {worst}"
        moved = max(mine[k].abs().max().item() for k in mine if k.endswith(".lora_B"))
        assert moved > 0  # B starts at zero: the step really trained the adapter
    engine = LocalEngine(model())  # the published adapter versions, installed and verified by a subscriber
    sub = Subscriber(str(tmp_path / "weights"), engine)
    assert sub.poll(target=1) == 1 and sub.poll() == 2 and sub.metrics[-1]["path"] == "delta"
    assert all(torch.equal(v, theirs[k]) for k, v in engine.served_adapter().items())
    resumed = load_file(str(tmp_path / "adapter_resumed.safetensors"))
    continued = load_file(str(tmp_path / "adapter_2.safetensors"))
    assert all(torch.equal(resumed[k], continued[k]) for k in continued)


if __name__ == "__main__":
    _ranks(Path(sys.argv[1]))
