"""The main job on the demo config: build the tokenizer and the `tiny` model, mid-train it on agent
transcripts, evaluate held-out pass@1, run asynchronous RL, evaluate again and write
runs/demo/report.html. Ctrl-C stops cleanly with a checkpoint; run it again with --resume.
"""

from __future__ import annotations

import argparse

HELP = "run the main job on configs/demo.toml (what `make demo` runs)"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default="configs/demo.toml", help="config file (default: configs/demo.toml)")
    p.add_argument("--config", dest="config_opt", default=None, help=argparse.SUPPRESS)  # the older spelling
    p.add_argument("--resume", action="store_true", help="continue the run in run_dir")
    p.add_argument("--fresh", action="store_true", help="delete an existing run_dir first")


def run(args: argparse.Namespace) -> int:
    from flywheel.commands.train import start

    return start(args.config_opt or args.config, args.overrides, resume=args.resume, fresh=args.fresh)
