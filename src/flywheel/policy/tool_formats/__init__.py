"""Tool-call formats, one per model family, and the registry that picks one (`model.tool_format`).

    from flywheel.policy.tool_formats import build_tool_format, pick_tool_format
    name = pick_tool_format("auto", has_token)   # "mistral" / "llama3_json" / "hermes" from the tokenizer's tokens
    fmt = build_tool_format(name, has_token)     # a ToolFormat (base.py); `has_token(s)`: is s one added token?

`auto` reads the family off the tokenizer, the only thing every model directory carries: `[TOOL_CALLS]` is
Mistral's v3 tokenizer, `<|eot_id|>` is Llama 3's, anything else (ChatML: flywheel's own tokenizer, Qwen,
SmolLM2) gets Hermes. A registry is a plain dict; an unknown name is refused with the list of names.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tool_formats.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from flywheel.policy.tool_formats.base import HasToken, ParsedTurn, Piece, ToolFormat
from flywheel.policy.tool_formats.hermes import Hermes
from flywheel.policy.tool_formats.llama3_json import Llama3Json
from flywheel.policy.tool_formats.mistral import Mistral

TOOL_FORMATS: dict[str, Callable[[HasToken], ToolFormat]] = {
    "hermes": lambda has_token: Hermes(),
    "llama3_json": Llama3Json,
    "mistral": lambda has_token: Mistral(),
}
TOOL_FORMAT_NAMES = ("auto", *TOOL_FORMATS)


def pick_tool_format(name: str, has_token: HasToken) -> str:
    """`name` itself, or for "auto" the format the tokenizer's own tokens name."""
    if name != "auto":
        if name not in TOOL_FORMATS:
            raise ValueError(f"unknown tool format {name!r}; use one of {', '.join(TOOL_FORMAT_NAMES)}")
        return name
    if has_token("[TOOL_CALLS]"):
        return "mistral"
    if has_token("<|eot_id|>"):
        return "llama3_json"
    return "hermes"


def build_tool_format(name: str, has_token: HasToken) -> ToolFormat:
    """The ToolFormat `name` names ("auto" picks one, see `pick_tool_format`)."""
    return TOOL_FORMATS[pick_tool_format(name, has_token)](has_token)


__all__ = ["TOOL_FORMATS", "TOOL_FORMAT_NAMES", "HasToken", "ParsedTurn", "Piece", "ToolFormat", "build_tool_format",
           "pick_tool_format"]
