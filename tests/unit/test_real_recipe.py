"""The real-model recipe's stages (configs/real.toml): a pretrained model imported into the run directory brings
its own tokenizer and chat template, and mid-training starts from its weights, not from a random preset; a
second run of the stages reuses both. HumanEval comes from the installed wheel. The whole recipe learning is
tests/integration/test_real_learns.py."""

from transformers import AutoTokenizer

from flywheel.config import load_config
from flywheel.pipeline.midtrain import midtrain
from flywheel.pipeline.prepare import prepare_pretrained, prepare_tasks, prepare_tokenizer, tokenizer_dir
from flywheel.policy.model import load_model
from flywheel.tasks.humaneval import humaneval_tasks


def test_mid_training_starts_from_the_imported_model_with_its_tokenizer(smollm2, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config("configs/real.toml", [
        "--run_dir", str(run_dir), "--model.import_from", str(smollm2), "--synth.num_train", "8",
        "--synth.num_heldout", "2", "--midtrain.num_transcripts", "4", "--midtrain.batch_tokens", "1024"])
    # configs/real.toml's trainer.dtype = "auto": float32 where bf16 autocast would take torch's generic gemm
    train, _ = prepare_tasks(cfg, run_dir)
    pretrained = prepare_pretrained(cfg, run_dir)
    tokenizer = prepare_tokenizer(cfg, run_dir, train, pretrained)
    assert pretrained == run_dir / "pretrained" == tokenizer_dir(cfg, run_dir)
    assert not (run_dir / "tokenizer").exists()  # no tokenizer is trained for a pretrained model
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(smollm2).chat_template
    assert len(tokenizer) == 49152
    base = midtrain(cfg, run_dir, tokenizer, train, pretrained=pretrained)
    before, after = load_model(pretrained).state_dict(), load_model(base).state_dict()
    assert before.keys() == after.keys()
    moved = [(after[k].float() - before[k].float()).norm() / before[k].float().norm() for k in before]
    assert all(m < 0.05 for m in moved), max(moved)  # a fine-tune of these weights, not a new model
    assert any(m > 0 for m in moved)
    stamp = (base / "config.json").stat().st_mtime_ns
    assert prepare_pretrained(cfg, run_dir) == pretrained
    assert midtrain(cfg, run_dir, tokenizer, train, pretrained=pretrained) == base
    assert (base / "config.json").stat().st_mtime_ns == stamp  # both stages are reused on a rerun


def test_humaneval_tasks_come_from_the_installed_wheel():
    tasks = humaneval_tasks(3)
    assert [t.id for t in tasks] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(t.fail_to_pass == ["test_solution.py::test_check"] for t in tasks)
