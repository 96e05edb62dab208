"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` inside the assistant turn.

    <|im_start|>system\\n{system text}\\n\\n# Tools\\n{one JSON schema per line}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{tool output}<|im_end|>\\n

flywheel's own tokenizer, Qwen2/Qwen3 and SmolLM2 (ChatML) use it; it is `auto`'s choice for every tokenizer that
has neither Llama-3 nor Mistral tool tokens. The tags are single tokens where the tokenizer has them (ours, Qwen's)
and plain text otherwise (SmolLM2): the model writes them as it writes any text, and calls are only ever parsed
from what it sampled. A template with no `tool` role (Qwen2.5 renders results as a user turn) gets the results as
`<tool_response>\\n{output}\\n</tool_response>` in a user turn. Marker strings inside a call's JSON are written with
a JSON escape (`\\u003c|im_end|>`), so a call that writes this very file parses back to the same arguments.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_chat.py tests/unit/test_tool_formats.py`.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from flywheel.policy.tool_formats.base import (
    MAX_RAW_CHARS,
    ParsedTurn,
    Piece,
    call_json,
    check_call,
    decode_error,
    held_back,
    loads,
)
from flywheel.types import Message, ToolCall, ToolCallError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
MARKERS = (ENDOFTEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)  # escaped inside call JSON
CALL_SHAPE = f'{TOOL_CALL_OPEN}{{"name": "<tool name>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}'


def tools_text(tools: list[dict]) -> str:
    """'# Tools' and one JSON schema per line ("" for no tools): what the system prompt ends with."""
    if not tools:
        return ""
    return "# Tools\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def format_tool_call(call: ToolCall) -> str:
    """The canonical JSON of one call, `{"name": ..., "arguments": {...}}`, without the <tool_call> tags."""
    return call_json(call, "arguments", MARKERS)


class Hermes:
    """The Hermes/Qwen format (see the module docstring)."""

    name = "hermes"
    markers: tuple[str, ...] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
    end_of_call: str | None = None

    def tools_system_text(self, tools: list[dict]) -> str:
        return tools_text(tools)

    def tools_preamble(self, tools: list[dict]) -> list[Piece]:
        return []

    def call_pieces(self, calls: list[ToolCall]) -> list[Piece]:
        pieces: list[Piece] = []
        for call in calls:
            pieces += [(TOOL_CALL_OPEN, True), (format_tool_call(call), False), (TOOL_CALL_CLOSE, True)]
        return pieces

    def tool_result(self, message: Message, roles: Collection[str]) -> tuple[str | None, list[Piece]]:
        if "tool" in roles:
            return "tool", [(message.content, False)]
        return "user", [(TOOL_RESPONSE_OPEN, True), ("\n" + message.content + "\n", False),
                        (TOOL_RESPONSE_CLOSE, True)]

    def parse(self, text: str, tools: dict[str, dict]) -> ParsedTurn:
        return parse_calls(text, tools)

    def content_ready(self, text: str) -> tuple[str, bool]:
        return held_back(text, (TOOL_CALL_OPEN, TOOL_CALL_CLOSE))  # a stray close tag is not content either


def _parse_call(body: str, tools: dict[str, dict], index: int) -> ToolCall | ToolCallError:
    try:
        obj = loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN, integers too long, nesting
        return decode_error(e, body, CALL_SHAPE)
    return check_call(obj, tools, index, body, args_keys=("arguments",), shape=CALL_SHAPE)


def parse_calls(text: str, tools: dict[str, dict]) -> ParsedTurn:
    """Split text into content and <tool_call> calls; every unusable call becomes a ToolCallError."""
    turn = ParsedTurn(content="")
    content: list[str] = []
    shown: list[str] = []  # content plus the text of every unusable call
    pos, index = 0, 0
    while pos < len(text):
        start = text.find(TOOL_CALL_OPEN, pos)
        stray = text.find(TOOL_CALL_CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            content.append(text[pos:stray])
            shown.append(text[pos:stray + len(TOOL_CALL_CLOSE)])
            turn.errors.append(ToolCallError("malformed_json", f"found {TOOL_CALL_CLOSE} without an opening "
                                             f"{TOOL_CALL_OPEN}. Write each call as {CALL_SHAPE}",
                                             text[max(0, stray - 200):stray + len(TOOL_CALL_CLOSE)]))
            pos = stray + len(TOOL_CALL_CLOSE)
            continue
        if start == -1:
            content.append(text[pos:])
            shown.append(text[pos:])
            break
        content.append(text[pos:start])
        shown.append(text[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        reopen = text.find(TOOL_CALL_OPEN, body_start)
        if end == -1 or (reopen != -1 and reopen < end):
            stop = len(text) if end == -1 else reopen
            body = text[body_start:stop]
            turn.errors.append(ToolCallError("malformed_json", f"{TOOL_CALL_OPEN} is never closed; end every call "
                                             f"with {TOOL_CALL_CLOSE}: {CALL_SHAPE}", body[:MAX_RAW_CHARS]))
            shown.append(text[start:stop])
            index += 1
            pos = stop
            continue
        result = _parse_call(text[body_start:end], tools, index)
        if isinstance(result, ToolCall):
            turn.tool_calls.append(result)
        else:
            turn.errors.append(result)
            shown.append(text[start:end + len(TOOL_CALL_CLOSE)])
        index += 1
        pos = end + len(TOOL_CALL_CLOSE)
    turn.content = "".join(content)
    turn.shown = "".join(shown)
    return turn
