"""Tokenizer: train a byte-level BPE with `tokenizers`, save/load it as a Hugging Face tokenizer with a chat template.

    from flywheel.policy.tokenizer import get_tokenizer
    tok = get_tokenizer(TokenizerConfig(vocab_size=2048), cache_dir="~/.cache/flywheel")  # trains once, then loads
    tok.decode(tok.encode(s)) == s   # for every str: byte-level, no normalizer, no added prefix space

Why: nothing is downloaded at run time, so the demo and the tests train their own tokenizer in about a second
on a deterministic local corpus (`default_corpus`: the Python standard library on this machine plus
synthetic agent transcripts in our chat format), so code, tool-call JSON and chat markup tokenize compactly.
Byte-level BPE with the GPT-2 pre-tokenizer regex makes every string round-trip exactly, unicode included.
The five markers are single tokens; <|endoftext|>, <|im_start|>, <|im_end|> are special (dropped by
`decode(skip_special_tokens=True)`), the tool-call tags are plain added tokens as in Qwen's tokenizer, so a
Qwen checkpoint's tokenizer (`tokenizer.path`) works with the same chat format.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tokenizer.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from flywheel.config import TokenizerConfig, UserError
from flywheel.policy.chat import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    render_chat_text,
)
from flywheel.types import Message, ToolCall

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE]
_CONTROL_TOKENS = SPECIAL_TOKENS[:3]  # special: ids 0, 1, 2
_TAG_TOKENS = SPECIAL_TOKENS[3:]  # plain added tokens: the last two ids
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
_CACHE_FORMAT = 1  # bump when training or the default corpus changes: cached tokenizers are then retrained
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
              "__pycache__", "ensurepip", "tkinter", "pydoc_data"}
_MAX_FILE_BYTES = 32_768  # per stdlib file, so the corpus spans many modules rather than a few big ones
_CHAT_FRACTION = 0.2  # share of default_corpus bytes spent on synthetic transcripts


def train_tokenizer(corpus: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of exactly `vocab_size` tokens (fewer if the corpus has too few pairs)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB:
        raise ValueError(f"vocab_size must be an int >= {_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} "
                         f"special tokens), got {vocab_size!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    if isinstance(corpus, (str, bytes)):
        raise TypeError("corpus must be an iterable of str documents, not a single string")

    def documents() -> Iterator[str]:
        for i, doc in enumerate(corpus):
            if not isinstance(doc, str):
                raise TypeError(f"corpus item {i} is {type(doc).__name__}; every document must be a str")
            yield doc

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(_TAG_TOKENS), min_frequency=min_frequency, show_progress=False,
        special_tokens=_CONTROL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(documents(), trainer)
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in _TAG_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END], clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(tok: PreTrainedTokenizerFast, path: str | Path) -> None:
    """Write a HF tokenizer dir (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(path))


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer dir written by `save_tokenizer` (or any HF dir with a tokenizer.json)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UserError(f"tokenizer directory {str(path)!r} does not exist; set tokenizer.path to a directory "
                         "written by save_tokenizer, or leave it unset to train one")
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"{str(path)!r} is not a tokenizer directory: it has no tokenizer.json")
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    except Exception as e:  # a corrupt file surfaces as many different exception types
        raise UserError(f"could not load the tokenizer in {str(path)!r}: {type(e).__name__}: {e}") from None


def cache_key(cfg: TokenizerConfig) -> str:
    """Directory name of the cached tokenizer for `cfg` (changes when anything that shapes it changes)."""
    digest = hashlib.sha256(json.dumps([_CACHE_FORMAT, CHAT_TEMPLATE, SPECIAL_TOKENS, list(sys.version_info[:2]),
                                        _stdlib_dir()]).encode()).hexdigest()[:12]
    return f"bpe-v{cfg.vocab_size}-f{cfg.min_frequency}-b{cfg.corpus_bytes}-{digest}"


def get_tokenizer(cfg: TokenizerConfig, cache_dir: str | Path) -> PreTrainedTokenizerFast:
    """Load `cfg.path`, or train on `default_corpus` once and cache it under `cache_dir`."""
    if cfg.path:
        return load_tokenizer(cfg.path)
    cache_dir = Path(cache_dir).expanduser()
    final = cache_dir / cache_key(cfg)
    if (final / "tokenizer.json").is_file():
        return load_tokenizer(final)
    tok = train_tokenizer(default_corpus(cfg.corpus_bytes), cfg.vocab_size, cfg.min_frequency)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir))
    save_tokenizer(tok, tmp)
    try:
        os.rename(tmp, final)  # atomic: a concurrent process sees no half-written directory
    except OSError:  # another process cached it first; training is deterministic, so it is the same tokenizer
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / "tokenizer.json").is_file():
            raise
    return load_tokenizer(final)


# ------------------------------------------------------------------------------------------ default corpus


def _stdlib_dir() -> str:
    return sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__)


def _stdlib_files() -> list[Path]:
    root = Path(_stdlib_dir())
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]  # prune: site-packages can be huge
        files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read(path: Path) -> str:
    try:
        return path.read_bytes()[:_MAX_FILE_BYTES].decode("utf-8", errors="ignore")
    except OSError:
        return ""


def _code_documents(budget: int) -> Iterator[str]:
    """Standard-library sources, spread evenly over the (sorted) tree until `budget` bytes."""
    files = _stdlib_files()
    if not files:
        return
    total = sum(min(p.stat().st_size, _MAX_FILE_BYTES) for p in files)
    stride = max(1, total // max(budget, 1))
    used = 0
    for offset in range(stride):  # passes with shifted strides until the budget is spent
        for path in files[offset::stride]:
            text = _read(path)
            size = len(text.encode())
            if used + size > budget:
                return
            used += size
            yield text


def _tool(name: str, description: str, props: dict[str, str], required: tuple[str, ...] = ()) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in props.items()},
                           "required": list(required)}}


# Mirrors the harness's tools (flywheel.envs.tools) without importing it: policy/ must not depend on envs/.
_TOOLS = [
    _tool("view", "Show a file with line numbers (optional line range).",
          {"path": "string", "start": "integer", "end": "integer"}, ("path",)),
    _tool("str_replace", "Replace the one occurrence of old with new in a file.",
          {"path": "string", "old": "string", "new": "string"}, ("path", "old", "new")),
    _tool("write", "Create or overwrite a file.", {"path": "string", "content": "string"}, ("path", "content")),
    _tool("bash", "Run a shell command.", {"command": "string"}, ("command",)),
    _tool("run_tests", "Run the visible tests.", {}),
    _tool("search", "Find a regex in files.", {"pattern": "string", "path": "string"}, ("pattern",)),
    _tool("submit", "Finish; your changes are graded.", {}),
]
_SYSTEM = ["You are a coding agent. Use the tools to inspect the repository, edit files and run the tests. "
           "Call submit when the tests pass.", "You fix bugs in Python repositories.", ""]
_ASKS = ["Fix the bug in `{path}`: `{name}` returns the wrong result.", "The tests for `{name}` fail. Find the "
         "cause in {path} and fix it.", "Implement the missing behaviour of `{name}` in {path}.",
         "`{name}` raises an exception on empty input. Make it return None instead."]
_THOUGHTS = ["Let me look at the file first.", "I'll open {path}.", "The problem is in `{name}`. Let me fix it.",
             "Now I'll run the tests.", "", "Let me search for the definition of `{name}`.",
             "The tests pass, so I will submit."]


def _chat_documents(budget: int, snippets: list[str]) -> Iterator[str]:
    """Synthetic agent sessions in the chat format (tools in the system prompt, calls, observations)."""
    rng = random.Random(0)
    used = 0
    while snippets and used < budget:
        code = rng.choice(snippets)
        lines = code.splitlines() or [""]
        start = rng.randrange(len(lines))
        chunk = "\n".join(lines[start:start + rng.randint(3, 30)])
        names = [w.split("(")[0] for line in lines if line.lstrip().startswith("def ")
                 for w in line.split()[1:2]] or ["main"]
        name, path = rng.choice(names), f"src/{rng.choice(['app', 'lib', 'utils', 'core'])}/{rng.choice(names)}.py"
        fmt = dict(path=path, name=name)

        def say(i: int, fmt: dict = fmt) -> str:
            return _THOUGHTS[i].format(**fmt)

        old = rng.choice(chunk.splitlines() or ["pass"])
        messages = [Message("system", rng.choice(_SYSTEM)), Message("user", rng.choice(_ASKS).format(**fmt)),
                    Message("assistant", say(rng.choice([0, 1])), [ToolCall("view", {"path": path})]),
                    Message("tool", "\n".join(f"{start + i + 1:>4} {line}" for i, line in
                                               enumerate(chunk.splitlines())), name="view"),
                    Message("assistant", say(2), [ToolCall("str_replace", {"path": path, "old": old,
                                                                    "new": old.replace("==", "!=")})]),
                    Message("tool", f"Edited {path}: replaced 1 occurrence.", name="str_replace"),
                    Message("assistant", say(rng.choice([3, 4])),
                            [ToolCall("run_tests", {}) if rng.random() < 0.5
                             else ToolCall("bash", {"command": f"python -m pytest -q tests/test_{name}.py"})]),
                    Message("tool", rng.choice([f"{rng.randint(1, 40)} passed in 0.{rng.randint(10, 99)}s",
                                                f"FAILED tests/test_{name}.py::test_{name} - AssertionError\n"
                                                f"1 failed, {rng.randint(1, 9)} passed"]), name="run_tests"),
                    Message("assistant", say(rng.choice([5, 6])), [ToolCall("search", {"pattern": f"def {name}"})
                                                                 if rng.random() < 0.3 else ToolCall("submit", {})])]
        text = render_chat_text(messages, _TOOLS, add_generation_prompt=False)
        used += len(text.encode())
        yield text


def default_corpus(max_bytes: int = 4_000_000) -> Iterator[str]:
    """Deterministic training text, no network: stdlib sources plus synthetic chat transcripts (<= max_bytes)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    chat_budget = int(max_bytes * _CHAT_FRACTION)
    snippets: list[str] = []
    for text in _code_documents(max_bytes - chat_budget):
        if len(snippets) < 200:
            snippets.append(text)
        yield text
    used = 0
    for text in _chat_documents(chat_budget, snippets or ["def main():\n    return 0\n"]):
        used += len(text.encode())
        if used > chat_budget:
            return
        yield text
