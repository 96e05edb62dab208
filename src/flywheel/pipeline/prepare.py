"""Prepare a run: its task sets and its tokenizer, cached in the run directory.

    train, heldout = prepare_tasks(cfg, run_dir)
    pretrained = prepare_pretrained(cfg, run_dir)          # model.import_from, imported once; else None
    tokenizer = prepare_tokenizer(cfg, run_dir, train, pretrained)

Tasks come from `cfg.tasks` / `cfg.eval_tasks` (any format `load_tasks` reads) or, when those are empty,
from the synthetic generator (train and held-out splits never share a function). Broken tasks in a file
are reported by id and skipped. The tokenizer is trained on the standard-library corpus plus the task
texts, so code, statements and tool calls tokenize compactly. A pretrained model (`model.import_from`) is
imported into `<run_dir>/pretrained` (policy/model_import.py) and brings its own tokenizer and chat template.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

from flywheel.config import FlywheelConfig, UserError
from flywheel.policy.model_import import import_model
from flywheel.policy.tokenizer import default_corpus, load_tokenizer, save_tokenizer, train_tokenizer
from flywheel.tasks.loaders import load_tasks, save_tasks
from flywheel.tasks.synth import Split, generate_tasks
from flywheel.types import Task


def _load_or_synth(path: str, out: Path, n: int, split: Split, cfg: FlywheelConfig, seed: int) -> list[Task]:
    if path:
        loaded = load_tasks(path)
        for err in loaded.errors:
            print(f"skipping task {err.task_id or '?'} (line {err.line}): {err.reason}")
        if not loaded.tasks:
            raise ValueError(f"task file '{path}' holds no usable task")
        return loaded.tasks
    if out.exists():
        return load_tasks(out).tasks
    diffs = cfg.synth.difficulties
    tasks: list[Task] = []
    for i, d in enumerate(diffs):  # an equal share per difficulty level
        share = n // len(diffs) + (1 if i < n % len(diffs) else 0)
        tasks += generate_tasks(share, seed=seed + 101 * i, split=split, difficulty=d,
                                runner=cfg.synth.test_runner)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_tasks(tasks, out)
    return tasks


def prepare_tasks(cfg: FlywheelConfig, run_dir: Path) -> tuple[list[Task], list[Task]]:
    train = _load_or_synth(cfg.tasks, run_dir / "tasks" / "train.jsonl", cfg.synth.num_train, "train", cfg, cfg.seed)
    heldout = _load_or_synth(cfg.eval_tasks, run_dir / "tasks" / "heldout.jsonl", cfg.synth.num_heldout, "heldout",
                             cfg, cfg.seed + 1)
    return train, heldout[: cfg.eval.num_tasks]


def task_corpus(tasks: list[Task]):
    """Problem statements and workspace files, each distinct text once (a file every task ships, such as
    the test runner, would otherwise count thousands of times and skew the BPE merges)."""
    seen: set[str] = set()
    for t in tasks:
        yield t.problem
        for text in t.files.values():
            if text not in seen:
                seen.add(text)
                yield text


def prepare_pretrained(cfg: FlywheelConfig, run_dir: Path) -> Path | None:
    """Import `model.import_from` into `<run_dir>/pretrained` (once, in `model.dtype`); None when it is unset."""
    if not cfg.model.import_from:
        return None
    out = run_dir / "pretrained"
    if not (out / "flywheel_import.json").exists():
        shutil.rmtree(out, ignore_errors=True)  # an import this job started and did not finish
        import_model(cfg.model.import_from, out, dtype=cfg.model.dtype)
    return out


def tokenizer_dir(cfg: FlywheelConfig, run_dir: Path) -> Path:
    """Where the run's tokenizer lives: `tokenizer.path`, the imported model's, the one saved with `model.path`, or
    the one trained for the run. A base policy (`model.path`) never gets a freshly trained tokenizer: its token ids
    would not be the ones it was trained on."""
    if cfg.tokenizer.path:
        return Path(cfg.tokenizer.path)
    if cfg.model.import_from:
        return run_dir / "pretrained"
    if cfg.model.path:
        if not (Path(cfg.model.path) / "tokenizer.json").is_file():
            raise UserError(f"model.path {cfg.model.path} has no tokenizer (tokenizer.json); set tokenizer.path to "
                            f"the tokenizer it was trained with (e.g. the run's <run_dir>/tokenizer)")
        return Path(cfg.model.path)
    return run_dir / "tokenizer"


def prepare_tokenizer(cfg: FlywheelConfig, run_dir: Path, tasks: list[Task], pretrained: Path | None = None):
    """Load `tokenizer.path`, the pretrained model's or the base policy's, or train one on the default corpus plus
    task texts (cached in run_dir)."""
    if cfg.tokenizer.path or pretrained is not None or cfg.model.path:
        return load_tokenizer(tokenizer_dir(cfg, run_dir))
    out = run_dir / "tokenizer"
    if (out / "tokenizer.json").exists():
        return load_tokenizer(out)
    corpus = itertools.chain(default_corpus(), task_corpus(tasks))
    tok = train_tokenizer(corpus, cfg.tokenizer.vocab_size, cfg.tokenizer.min_frequency)
    save_tokenizer(tok, out)
    return tok
