"""Llama-3 JSON tool calls: the assistant message is the call, `{"name": ..., "parameters": {...}}`.

    <|start_header_id|>system<|end_header_id|>\\n\\n{system text}\\n\\nYou have access to the following functions...
    <|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>{"name": "view", "parameters": {"path": "a.py"}}<|eom_id|>
    <|start_header_id|>ipython<|end_header_id|>\\n\\n{tool output}<|eot_id|>

Llama 3.1-3.3's convention for custom tools (the tool list in the system prompt, as their template's
`tools_in_user_message=false` writes it). Where the tokenizer has `<|python_tag|>` a call is written after it, and
where it has `<|eom_id|>` a turn that calls tools ends with it ("end of message: the tool answers next") instead of
<|eot_id|>; a tokenizer without them gets bare JSON and <|eot_id|>. Reading a turn: text after `<|python_tag|>` is
calls; without the tag, calls begin at the first `{"name"`; several calls are separated by newlines or `;`. Both
"parameters" (Llama's key) and "arguments" are read. Tool results are the template's `tool` turn (Llama 3.1 writes
it as `ipython`), or a user turn where the template has none.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tool_formats.py`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from flywheel.policy.tool_formats.base import (
    HasToken,
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

PYTHON_TAG = "<|python_tag|>"
EOM = "<|eom_id|>"
EOT = "<|eot_id|>"
_ESCAPED = (PYTHON_TAG, EOM, EOT, "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>", "<|end_of_text|>")
_CALL_START = re.compile(r'\{\s*"name"\s*:')
_PROMPT = ("You have access to the following functions. To call a function, please respond with JSON for a function "
           'call. Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
           "value}. Do not use variables.\n\n")


def _may_open_call(after_brace: str) -> bool:
    """Can text that follows a `{` still grow into `{"name":` (whitespace, then a prefix of `"name"`, then `:`)?"""
    rest = after_brace.lstrip()
    if '"name"'.startswith(rest):
        return True
    return rest.startswith('"name"') and not rest[len('"name"'):].strip()


class Llama3Json:
    """The Llama-3 JSON format (see the module docstring); `python_tag`/`eom` where the tokenizer has them."""

    name = "llama3_json"

    def __init__(self, has_token: HasToken):
        self.python_tag = has_token(PYTHON_TAG)
        self.end_of_call: str | None = EOM if has_token(EOM) else None
        self.markers = tuple(m for m, on in ((PYTHON_TAG, self.python_tag), (EOM, bool(self.end_of_call))) if on)
        self.shape = (PYTHON_TAG if self.python_tag else "") + '{"name": "<tool name>", "parameters": {...}}'

    def tools_system_text(self, tools: list[dict]) -> str:
        if not tools:
            return ""
        return _PROMPT + "\n\n".join(json.dumps(t, ensure_ascii=False, indent=4) for t in tools)

    def tools_preamble(self, tools: list[dict]) -> list[Piece]:
        return []

    def call_pieces(self, calls: list[ToolCall]) -> list[Piece]:
        if not calls:
            return []
        body = "\n".join(call_json(c, "parameters", _ESCAPED) for c in calls)
        return ([(PYTHON_TAG, True)] if self.python_tag else []) + [(body, False)]

    def tool_result(self, message: Message, roles: Collection[str]) -> tuple[str | None, list[Piece]]:
        return ("tool" if "tool" in roles else "user"), [(message.content, False)]

    def content_ready(self, text: str) -> tuple[str, bool]:
        ready, begun = held_back(text, (PYTHON_TAG,)) if self.python_tag else (text, False)
        m = _CALL_START.search(ready)
        if m is not None:
            return ready[:m.start()], True
        if not begun:  # a tail that may still become `{"name":` is not content yet
            brace = ready.rfind("{")
            if brace != -1 and _may_open_call(ready[brace + 1:]):
                ready = ready[:brace]
        return ready, begun

    def parse(self, text: str, tools: dict[str, dict]) -> ParsedTurn:
        tag = text.find(PYTHON_TAG) if self.python_tag else -1
        if tag != -1:
            content, start = text[:tag], tag + len(PYTHON_TAG)
        else:
            m = _CALL_START.search(text)
            if m is None:
                return ParsedTurn(content=text, shown=text)
            content, start = text[:m.start()], m.start()
        turn = ParsedTurn(content=content)
        shown = [content]
        pos, index = start, 0
        while True:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
                pos += 1
            if pos >= len(text):
                break
            if text[pos] != "{":
                rest = text[pos:]
                turn.errors.append(ToolCallError(
                    "malformed_json", f"text after the tool calls; a turn that calls tools holds only the calls, "
                    f"one per line: {self.shape}", clip(rest)))
                shown.append(rest)
                break
            try:
                obj, end = raw_decode(text, pos)
            except (ValueError, RecursionError) as e:
                turn.errors.append(decode_error(e, text[pos:], self.shape))
                shown.append(text[pos:])
                break
            result = check_call(obj, tools, index, text[pos:end], args_keys=("parameters", "arguments"),
                                shape=self.shape)
            if isinstance(result, ToolCall):
                turn.tool_calls.append(result)
            else:
                turn.errors.append(result)
                shown.append(text[pos:end])
            index += 1
            pos = end
        turn.shown = "".join(shown)
        return turn
