"""The demo's mid-trained base policy, built once per test session for the tests that check learning.

Mid-training the demo's base is the longest stage (the fixture took 498–550 s on a 2-core Intel CI host), so the
tests that run RL on the demo's config (locally in test_demo_learns.py, on Ray in test_ray.py) share it. It is
built by the same stage functions `flywheel train` runs (pipeline/prepare.py, pipeline/midtrain.py) and scored
once on the held-out tasks; each test then runs the job with `model.path` pointing at it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"


@dataclass
class DemoBase:
    model_dir: Path
    tokenizer_dir: Path
    pass1: float  # held-out pass@1 of the base, as the demo's config evaluates it

    def config(self, run_dir: Path, *extra: str):
        """The demo config for a run from this base (`extra`: more `--section.key value` overrides)."""
        from flywheel.config import load_config

        return load_config(str(DEMO_CONFIG), ["--run_dir", str(run_dir), "--model.path", str(self.model_dir),
                                              "--tokenizer.path", str(self.tokenizer_dir), *extra])

    def seed_summary(self, run_dir: Path) -> None:
        """Start `run_dir`'s summary and eval_before.jsonl with the base's scores, so the job skips its own
        eval-before stage."""
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({"pass1_before": self.pass1}) + "\n")
        shutil.copyfile(self.model_dir.parent / "eval_before.jsonl", run_dir / "eval_before.jsonl")


@pytest.fixture(scope="session")
def demo_base(tmp_path_factory) -> DemoBase:
    from flywheel.config import load_config
    from flywheel.pipeline.evaluation import evaluate_model
    from flywheel.pipeline.midtrain import midtrain
    from flywheel.pipeline.prepare import prepare_tasks, prepare_tokenizer

    root = tmp_path_factory.mktemp("demo-base")
    cfg = load_config(str(DEMO_CONFIG), ["--run_dir", str(root)])
    train, heldout = prepare_tasks(cfg, root)
    tokenizer = prepare_tokenizer(cfg, root, train)
    model_dir = midtrain(cfg, root, tokenizer, train)
    pass1 = evaluate_model(cfg, model_dir, tokenizer, heldout, root / "cache" / "eval",
                           out_jsonl=root / "eval_before.jsonl").pass_at[1]
    return DemoBase(model_dir, root / "tokenizer", pass1)
