"""Train a policy with RL: `flywheel train CONFIG [--resume] [--section.key VALUE ...]`.

Stages (each skipped when its output is already in run_dir): tasks and tokenizer, mid-training (unless
model.path names a base policy), held-out eval, RL (orchestrator.mode async or sync), eval, report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run RL from a config (mid-training first unless model.path is set)"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="TOML config file")
    p.add_argument("--resume", action="store_true", help="continue the run in run_dir from its last checkpoint")
    p.add_argument("--fresh", action="store_true", help="delete an existing run_dir first")


def remove_run_dir(run_dir: Path) -> None:
    """--fresh: delete run_dir, but only one that holds a flywheel run (its config.json) or nothing."""
    import shutil

    from flywheel.config import UserError

    if not run_dir.exists():
        return
    if any(run_dir.iterdir()) and not (run_dir / "config.json").is_file():
        raise UserError(f"--fresh: '{run_dir}' is not a flywheel run directory (no config.json), so it is not "
                        f"deleted; set --run_dir to a new directory")
    shutil.rmtree(run_dir)


def start(config: str, overrides: list[str], *, resume: bool, fresh: bool) -> int:
    from flywheel.config import UserError, load_config
    from flywheel.pipeline.job import run_job

    cfg = load_config(config, overrides)
    if fresh and resume:
        raise UserError("pass --resume (continue the run in run_dir) or --fresh (delete it first), not both")
    if fresh:
        remove_run_dir(Path(cfg.run_dir))
    summary = run_job(cfg, resume=resume)
    return 0 if summary.get("rl", {}).get("interrupted") is not True else 130


def run(args: argparse.Namespace) -> int:
    return start(args.config, args.overrides, resume=args.resume, fresh=args.fresh)
