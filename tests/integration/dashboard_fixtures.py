"""Real run directories for the dashboard's browser tests: a tiny RL run, scripted sessions, broken runs.

The server and the browser come from flywheel.metrics.dashboard.browser (the benchmark uses the same ones).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from flywheel.config import EnvConfig, load_config, save_config
from flywheel.envs.tools import tools_for
from flywheel.orchestrator.loop import AdmittedLog, run_rl
from flywheel.pipeline.evaluation import evaluate_model
from flywheel.pipeline.scripted import scripted_group
from flywheel.policy.chat import ChatFormat
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, load_tokenizer, save_tokenizer, train_tokenizer
from flywheel.rollout.evaluate import paired_difference
from flywheel.tasks.loaders import save_tasks
from flywheel.tasks.synth import generate_tasks

ENV = EnvConfig(sandbox="local", tools="core")


def run_config(run_dir: Path, tokenizer_dir: Path, mode: str, num_steps: int, *extra: str):
    return load_config(None, [*extra,
        "--run_dir", str(run_dir), "--tokenizer.path", str(tokenizer_dir), "--orchestrator.mode", mode,
        "--orchestrator.drop_uniform_groups", "false", "--orchestrator.max_staleness", "8",
        "--env.tools", "core", "--env.sandbox", "local", "--rollout.group_size", "2", "--rollout.max_turns", "2",
        "--rollout.max_new_tokens", "16", "--rollout.concurrency", "4", "--trainer.batch_size", "4",
        "--trainer.num_steps", str(num_steps), "--trainer.lr", "1e-5"])  # an lr's ticks must read as 1e-5


class Base:
    """A tokenizer, a random tiny policy and tasks: what every run here starts from."""

    def __init__(self, root: Path):
        self.root = root
        tok = train_tokenizer(default_corpus(200_000), 512)
        save_tokenizer(tok, root / "tokenizer")
        cfg = load_config(None, ["--model.preset", "tiny"])
        save_model(build_model(cfg.model, len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
                   root / "model")
        self.tasks = generate_tasks(6, seed=3, split="train", difficulty="easy")
        self.heldout = generate_tasks(3, seed=4, split="heldout", difficulty="easy")
        self.chat = ChatFormat(tok, tools_for(ENV))

    def run(self, run_dir: Path, mode: str, num_steps: int, *extra: str, evals: bool = False) -> dict:
        """A real RL run (run_rl writes metrics.jsonl and trajectories/), optionally held-out evals around it;
        `extra`: more `--section.key value` overrides. Ends with summary.json as `flywheel train` writes it (the RL
        result, and with evals pass@1 before and after with the paired SE of the gain)."""
        cfg = run_config(run_dir, self.root / "tokenizer", mode, num_steps, *extra)
        save_config(cfg, run_dir)
        save_tasks(self.tasks, run_dir / "tasks" / "train.jsonl")  # where prepare_tasks keeps a job's tasks
        save_tasks(self.heldout, run_dir / "tasks" / "heldout.jsonl")
        if evals:
            tok = load_tokenizer(self.root / "tokenizer")
            evaluate_model(cfg, self.root / "model", tok, self.heldout, run_dir / "cache" / "eval",
                           run_dir / "eval_before.jsonl")
        out = run_rl(cfg, run_dir, self.root / "model", self.root / "tokenizer", self.tasks)
        summary: dict = {"rl": out}
        if evals:
            evaluate_model(cfg, run_dir / "final_model", tok, self.heldout, run_dir / "cache" / "eval",
                           run_dir / "eval_after.jsonl")
            before, after = ([json.loads(line) for line in (run_dir / f"eval_{n}.jsonl").read_text().splitlines()]
                             for n in ("before", "after"))
            gain, se, _ = paired_difference(after, before)
            summary.update(pass1_before=sum(r["correct"] / r["n"] for r in before) / len(before),
                           pass1_after=sum(r["correct"] / r["n"] for r in after) / len(after), pass1_gain=gain,
                           pass1_gain_se=se)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return out

    def append_scripted_group(self, run_dir: Path, version: int, seed: int = 0) -> list:
        """A group of scripted-policy sessions (real harness and grader), appended as the loop appends groups."""
        group = scripted_group(self.chat, self.tasks[0], ENV, run_dir / "cache" / "scripted", version=version,
                               seed=seed)
        log = AdmittedLog(run_dir / "trajectories" / "admitted.jsonl")
        log.append(group)
        log.close()
        return group


def make_bad_runs(root: Path, good: Path) -> None:
    """A half-written run (config only, a torn trajectory line) and one whose metrics.jsonl has a corrupt line."""
    half = root / "half-written"
    (half / "trajectories").mkdir(parents=True)
    shutil.copy(good / "config.json", half / "config.json")
    first = (good / "trajectories" / "admitted.jsonl").read_bytes().split(b"\n")[0]
    (half / "trajectories" / "admitted.jsonl").write_bytes(first[: len(first) // 2])  # no newline: being written
    corrupt = root / "corrupt-metrics"
    corrupt.mkdir()
    shutil.copy(good / "config.json", corrupt / "config.json")
    lines = (good / "metrics.jsonl").read_text().splitlines()
    (corrupt / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": 2, "loss": 0.5, "trainer/bu', *lines[1:]])
                                           + "\n[1, 2, 3]\n" + '{"step": 99, "lo')




def make_wide_group_run(root: Path, good: Path, group: list, size: int = 8) -> str:
    """A run holding one group of `size` rollouts (the scripted sessions repeated): a group as wide as a real GRPO
    group, for the side-by-side layout. Returns the group id."""
    wide = root / "wide"
    wide.mkdir()
    shutil.copy(good / "config.json", wide / "config.json")
    gid = f"wide-{size}"
    log = AdmittedLog(wide / "trajectories" / "admitted.jsonl")
    log.append([replace(t, group_id=gid) for t in (group * size)[:size]])
    log.close()
    return gid
