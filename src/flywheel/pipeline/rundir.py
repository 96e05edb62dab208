"""Whether a run directory may take a config: a run never mixes stages made under two configs silently.

    changed = claim_run_dir(cfg, resume=False)   # UserError when run_dir holds another config's stages

Every stage of the job is skipped when its output is already in run_dir (tasks, tokenizer, base model), which is
what makes a rerun cheap and `--resume` exact. The price: a second `flywheel train` with another config into the
same directory would reuse the first one's stages while config.json said otherwise. So a directory that holds
another config's stages is refused unless the user says which they mean: `--resume` (continue it, with this
config from now on; the changed keys are printed), `--fresh` (delete it first) or another `--run_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flywheel.config import FlywheelConfig, UserError

CHOICES = "pass --resume to continue it (its finished stages are kept), --fresh to delete it and start over, or " \
          "another --run_dir"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"trainer.lr": 1e-5, ...}: every leaf of a nested dict under its dotted key."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old → new` for every dotted key whose value differs (a key only one side has included)."""
    a, b = flatten(old), flatten(new)
    return [f"{k}: {json.dumps(a.get(k))} → {json.dumps(b.get(k))}" for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)]


def claim_run_dir(cfg: FlywheelConfig, *, resume: bool) -> list[str]:
    """Refuse a run directory that holds a run or another config's stages (unless resuming); on resume, the keys
    that changed since the saved config."""
    run_dir = Path(cfg.run_dir)
    saved = run_dir / "config.json"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return []
    if not saved.is_file():
        if resume:
            raise UserError(f"run directory '{run_dir}' holds no run to resume (no config.json); drop --resume")
        return []
    try:
        old = json.loads(saved.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"run directory '{run_dir}': its config.json cannot be read ({err}); {CHOICES}") from None
    changes = config_changes(old, cfg.model_dump(mode="json"))
    if resume:
        return changes
    if (run_dir / "checkpoints").exists():
        raise UserError(f"run directory '{run_dir}' already holds a run; {CHOICES}")
    if changes:
        shown = "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")
        raise UserError(f"run directory '{run_dir}' holds stages made with another config ({shown}); {CHOICES}")
    return []
