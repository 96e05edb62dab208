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
    p.add_argument("--fresh", action="store_true", help="delete an existing run_dir first")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flywheel.commands.train import remove_run_dir
    from flywheel.config import UserError, load_config, save_config
    from flywheel.pipeline.job import Progress
    from flywheel.pipeline.midtrain import midtrain
    from flywheel.pipeline.prepare import prepare_tasks, prepare_tokenizer
    from flywheel.pipeline.rundir import claim_run_dir

    cfg = load_config(args.config, args.overrides)
    run_dir = Path(cfg.run_dir)
    if args.fresh:
        remove_run_dir(run_dir)
    changed = claim_run_dir(cfg, resume=True) if (run_dir / "config.json").is_file() else []
    if changed:  # another config's stages in run_dir are refused, not reused
        raise UserError(f"run directory '{run_dir}' holds stages made with another config ({'; '.join(changed[:4])}"
                        f"{' ...' if len(changed) > 4 else ''}); pass --fresh to delete it first, or another --run_dir")
    save_config(cfg, run_dir)
    train, _ = prepare_tasks(cfg, run_dir)
    tokenizer = prepare_tokenizer(cfg, run_dir, train)
    with Progress() as progress:
        out = midtrain(cfg, run_dir, tokenizer, train, on_progress=lambda s, i, n: progress.update(s, i, n))
    print(f"base policy: {out}")
    return 0
