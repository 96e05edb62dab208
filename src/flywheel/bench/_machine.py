"""Describe the machine a benchmark ran on, so figures are never quoted without it."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        from flywheel.modeling import blas

        info["mkl_cbwr"] = blas.mode()  # MKL's reproducibility mode (None: no MKL); modeling/blas.py
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def provenance() -> dict:
    """The commit (and whether the tree had uncommitted changes), the date and the exact command of a run."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["flywheel", *sys.argv[1:]]), "load_average_start": load_average()}


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages: how busy the machine was (2 cores here: above 2 is contention)."""
    return [round(x, 2) for x in os.getloadavg()]
