"""Mid-train a policy on agent transcripts: `flywheel midtrain CONFIG` writes <run_dir>/base_model.

Builds the tokenizer and the tasks when the run has none yet, renders `midtrain.num_transcripts`
scripted sessions through the real harness (imperfect and failed ones mixed in) and trains on them.
"""

from __future__ import annotations

import argparse

HELP = "mid-train the base policy on agent transcripts"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="TOML config file")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flywheel.config import load_config, save_config
    from flywheel.pipeline.job import Progress
    from flywheel.pipeline.midtrain import midtrain
    from flywheel.pipeline.prepare import prepare_tasks, prepare_tokenizer

    cfg = load_config(args.config, args.overrides)
    run_dir = Path(cfg.run_dir)
    save_config(cfg, run_dir)
    train, _ = prepare_tasks(cfg, run_dir)
    tokenizer = prepare_tokenizer(cfg, run_dir, train)
    with Progress() as progress:
        out = midtrain(cfg, run_dir, tokenizer, train, on_progress=lambda s, i, n: progress.update(s, i, n))
    print(f"base policy: {out}")
    return 0
