"""Mistral tool calls: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`, tools in `[AVAILABLE_TOOLS]`.

    <s>[AVAILABLE_TOOLS][{"type": "function", "function": {...}}][/AVAILABLE_TOOLS][INST]{system}\\n\\n{task}[/INST]
    {text}[TOOL_CALLS][{"name": "view", "arguments": {"path": "a.py"}}]</s>
    [TOOL_RESULTS]{"content": "{tool output}"}[/TOOL_RESULTS]

The v3 tokenizer's convention (Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Mistral-Nemo). Two deviations from
Mistral's own template, both for append-only rendering: the tool list stands before the first [INST] (Mistral's
template moves it to the last one each turn), and calls carry no 9-character ids (an "id" the model writes is
accepted and dropped). The markers are single tokens where the tokenizer has them, plain text otherwise.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tool_formats.py`.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from flywheel.policy.tool_formats.base import (
    ParsedTurn,
    Piece,
    call_json,
    check_call,
    clip,
    decode_error,
    held_back,
    raw_decode,
)
from flywheel.types import Message, ToolCall, ToolCallError

TOOL_CALLS = "[TOOL_CALLS]"
AVAILABLE_TOOLS, AVAILABLE_TOOLS_END = "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"
TOOL_RESULTS, TOOL_RESULTS_END = "[TOOL_RESULTS]", "[/TOOL_RESULTS]"
_ESCAPED = (TOOL_CALLS, AVAILABLE_TOOLS, AVAILABLE_TOOLS_END, TOOL_RESULTS, TOOL_RESULTS_END, "[INST]", "[/INST]",
            "</s>", "<s>")
CALL_SHAPE = f'{TOOL_CALLS}[{{"name": "<tool name>", "arguments": {{...}}}}]'


class Mistral:
    """The Mistral v3 format (see the module docstring)."""

    name = "mistral"
    markers: tuple[str, ...] = (TOOL_CALLS, AVAILABLE_TOOLS, AVAILABLE_TOOLS_END, TOOL_RESULTS, TOOL_RESULTS_END)
    end_of_call: str | None = None

    def tools_system_text(self, tools: list[dict]) -> str:
        return ""

    def tools_preamble(self, tools: list[dict]) -> list[Piece]:
        if not tools:
            return []
        listed = json.dumps([{"type": "function", "function": t} for t in tools], ensure_ascii=False)
        return [(AVAILABLE_TOOLS, True), (listed, False), (AVAILABLE_TOOLS_END, True)]

    def call_pieces(self, calls: list[ToolCall]) -> list[Piece]:
        if not calls:
            return []
        return [(TOOL_CALLS, True), ("[" + ", ".join(call_json(c, "arguments", _ESCAPED) for c in calls) + "]", False)]

    def tool_result(self, message: Message, roles: Collection[str]) -> tuple[str | None, list[Piece]]:
        body = json.dumps({"content": message.content}, ensure_ascii=False)
        return None, [(TOOL_RESULTS, True), (body, False), (TOOL_RESULTS_END, True)]

    def content_ready(self, text: str) -> tuple[str, bool]:
        return held_back(text, (TOOL_CALLS,))

    def parse(self, text: str, tools: dict[str, dict]) -> ParsedTurn:
        chunks = text.split(TOOL_CALLS)
        turn = ParsedTurn(content=chunks[0])
        shown = [chunks[0]]
        index = 0
        for chunk in chunks[1:]:
            bad = len(turn.errors)
            pos = len(chunk) - len(chunk.lstrip())
            try:
                value, end = raw_decode(chunk, pos)
            except (ValueError, RecursionError) as e:
                turn.errors.append(decode_error(e, chunk, CALL_SHAPE))
                shown.append(TOOL_CALLS + chunk)
                index += 1
                continue
            for obj in value if isinstance(value, list) else [value]:
                if isinstance(obj, dict) and isinstance(obj.get("id"), str):
                    obj = {k: v for k, v in obj.items() if k != "id"}
                result = check_call(obj, tools, index, json.dumps(obj, ensure_ascii=False), args_keys=("arguments",),
                                    shape=CALL_SHAPE)
                if isinstance(result, ToolCall):
                    turn.tool_calls.append(result)
                else:
                    turn.errors.append(result)
                index += 1
            if chunk[end:].strip():
                turn.errors.append(ToolCallError(
                    "malformed_json", f"text after the {TOOL_CALLS} list; a call list ends the turn: {CALL_SHAPE}",
                    clip(chunk[end:])))
            if len(turn.errors) > bad:
                shown.append(TOOL_CALLS + chunk)
        turn.shown = "".join(shown)
        return turn
