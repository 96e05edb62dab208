"""Write `<run_dir>/report.html` from a run's metrics.jsonl, summary.json and a sample of its transcripts."""

from __future__ import annotations

import argparse

HELP = "write the HTML report of a run directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flywheel.metrics.report import write_report

    if not (Path(args.run_dir) / "metrics.jsonl").exists():
        raise SystemExit(f"flywheel report: '{args.run_dir}' has no metrics.jsonl; is it a run directory?")
    print(write_report(args.run_dir))
    return 0
