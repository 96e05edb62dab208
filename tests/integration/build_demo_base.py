"""Build the demo's mid-trained base policy into ROOT (conftest.py runs this in the background).

    python tests/integration/build_demo_base.py ROOT [--nice N] [--section.key value ...]

The same stage functions `flywheel train` runs (pipeline/prepare.py, pipeline/midtrain.py), then the base is
scored once on the held-out tasks; ROOT/base.json ({"pass1": ...}) is written last, so its presence means done.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"


def build(root: Path, overrides: list[str]) -> float:
    from flywheel.config import load_config
    from flywheel.pipeline.evaluation import evaluate_model
    from flywheel.pipeline.midtrain import midtrain
    from flywheel.pipeline.prepare import prepare_tasks, prepare_tokenizer

    cfg = load_config(str(DEMO_CONFIG), ["--run_dir", str(root), *overrides])
    train, heldout = prepare_tasks(cfg, root)
    tokenizer = prepare_tokenizer(cfg, root, train)
    model_dir = midtrain(cfg, root, tokenizer, train)
    return evaluate_model(cfg, model_dir, tokenizer, heldout, root / "cache" / "eval",
                          out_jsonl=root / "eval_before.jsonl").pass_at[1]


def main(argv: list[str]) -> None:
    root, rest = Path(argv[0]), argv[1:]
    if rest[:1] == ["--nice"]:
        os.nice(int(rest[1]))
        rest = rest[2:]
    pass1 = build(root, rest)
    (root / "base.json").write_text(json.dumps({"pass1": pass1}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
