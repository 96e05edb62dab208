"""Find and check a model directory a user named, before anything slow loads it.

    path = resolve_model_dir("runs/demo/final_model")             # a local directory, checked
    path = resolve_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct")  # a Hub id: only from the local HF cache
    tok = check_tokenizer_dir(path)                                 # its tokenizer, and that it carries the chat format

`eval`, `serve` and `train --model.path` read a directory written by `flywheel train`/`midtrain`, by
`flywheel models import`, or by any HF tool. A mistake there (a typo, a directory without config.json or weights,
a tokenizer without ChatML markers) is found in milliseconds and reported as one `UserError` that says what to
pass instead, not after a model load of many seconds. Nothing here reaches the network: a Hub id resolves only to
a snapshot already in the local cache (`HF_HUB_OFFLINE` semantics).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from flywheel.config import UserError
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import load_tokenizer

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

_WRITERS = "a directory written by `flywheel train` (<run_dir>/final_model), `flywheel midtrain` (<run_dir>/base_model) " \
           "or `flywheel models import SRC --out DIR`"


def hub_snapshot(repo_id: str) -> Path | None:
    """The newest snapshot of `repo_id` in the local Hugging Face cache, or None when it is not there."""
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def resolve_model_dir(spec: str | Path, *, option: str = "--model") -> Path:
    """The checked model directory `spec` names: a local path, or a Hub id already in the local HF cache."""
    path = Path(spec).expanduser()
    if not path.exists():
        text = str(spec)
        if _HUB_ID.match(text) and not text.startswith(("./", "../")):
            snapshot = hub_snapshot(text)
            if snapshot is None:
                raise UserError(f"{option} {text}: no such directory, and the Hugging Face Hub model {text!r} is not "
                                f"in the local cache (flywheel never downloads). Download it where there is network "
                                f"(`huggingface-cli download {text}`) into this machine's HF cache, or pass "
                                f"{_WRITERS}")
            path = snapshot
        else:
            raise UserError(f"{option} {text}: no such directory; pass {_WRITERS}")
    return check_model_dir(path, option=option)


def check_model_dir(path: Path, *, option: str = "--model") -> Path:
    """`path` if it holds a loadable checkpoint (config.json and weights), else a UserError naming what is missing."""
    if not path.is_dir():
        raise UserError(f"{option} {path}: is a file, not a model directory; pass {_WRITERS}")
    if not (path / "config.json").is_file():
        hint = " (a .gguf file's directory: import it first with `flywheel models import FILE --out DIR`)" \
            if any(path.glob("*.gguf")) else ""
        raise UserError(f"{option} {path}: not a model directory, it has no config.json{hint}; pass {_WRITERS}")
    if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        raise UserError(f"{option} {path}: has a config.json but no weights (*.safetensors or pytorch_model*.bin); "
                        f"the save did not finish, or pass {_WRITERS}")
    return path


def check_tokenizer_dir(path: Path, *, option: str = "--model", tokenizer_option: str = "--tokenizer") -> Any:
    """The tokenizer in `path`, checked to carry flywheel's chat format (a UserError otherwise)."""
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"{option} {path}: has no tokenizer (tokenizer.json). Pass {tokenizer_option} DIR with the "
                        f"tokenizer the model was trained with (a run's <run_dir>/base_model or <run_dir>/tokenizer), "
                        f"or use a directory that carries it (`flywheel train` saves it with final_model)")
    tok = load_tokenizer(path)
    ChatFormat(tok)  # a TokenizerError (a UserError) names the marker it lacks
    return tok
