"""The tool-call format protocol, and what every format shares: the parsed turn, JSON checks and schema validation.

    from flywheel.policy.tool_formats import build_tool_format
    fmt = build_tool_format("hermes", has_token=lambda s: False)   # or "llama3_json", "mistral"
    fmt.call_pieces([ToolCall("view", {"path": "a.py"})])          # what an assistant turn's calls render to
    fmt.parse('<tool_call>{"name": "view", ...}</tool_call>', tools_by_name)  # ParsedTurn; never raises

Why a protocol: a model family's tool calls differ in three places only: how the system prompt lists the tools,
how a call and a tool result are written, and how a call is read back out of sampled text. The turn framing
(role headers, end-of-turn tokens) is the chat template's business (policy/chat_template.py) and the order of
tokens is `ChatFormat`'s (policy/chat.py), so a format is a few small pure functions over text pieces.
A piece is (text, is_marker): a marker is one of the format's own strings, one token where the tokenizer has it
and plain text otherwise; any other text is encoded with every added token switched off, so no tool output or
file can forge a marker. Parsing reports each unusable call as a `ToolCallError` with the shape to write, which
the model reads as an observation.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tool_formats.py tests/unit/test_chat.py`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from flywheel.types import Message, ToolCall, ToolCallError

# A piece is (text, is_marker): markers become the token the tokenizer has for them (else plain text), other text is
# encoded with markers off.
Piece = tuple[str, bool]
MAX_RAW_CHARS = 2000  # raw text kept in a ToolCallError (for logs); the model reads `message`


@dataclass
class ParsedTurn:
    """What an assistant turn said: free text, the usable tool calls, and one error per unusable call."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    # `content` with each unusable call's own text left where it stood: what an API client is shown, so that a
    # call to a tool the request did not declare reads as the text the model wrote, never as an empty message
    shown: str = ""


class ToolFormat(Protocol):
    """One family's tool-call convention. Implementations: hermes.py, llama3_json.py, mistral.py.

    A minimal format (calls written as `CALL {json}` on a line of their own) needs only:

        class Plain:
            name, markers, end_of_call = "plain", (), None
            def tools_system_text(self, tools): return "Tools:\\n" + "\\n".join(json.dumps(t) for t in tools)
            def tools_preamble(self, tools): return []
            def call_pieces(self, calls): return [("\\nCALL " + call_json(c, "arguments", ()), False) for c in calls]
            def tool_result(self, message, roles): return "tool" if "tool" in roles else "user", [(message.content, False)]
            def parse(self, text, tools): ...  # ParsedTurn with one ToolCallError per unusable call
            def content_ready(self, text): return held_back(text, ("\nCALL ",))
    """

    name: str
    markers: tuple[str, ...]  # the format's own strings; content can never produce them as tokens
    end_of_call: str | None  # the marker ending a turn that made calls instead of the end of turn (Llama's eom)

    def tools_system_text(self, tools: list[dict]) -> str:
        """Text describing `tools`, appended to the system prompt ("" when the format lists them elsewhere)."""
        ...

    def tools_preamble(self, tools: list[dict]) -> list[Piece]:
        """Pieces listing `tools` before the first turn (Mistral's [AVAILABLE_TOOLS]); [] when in the system text."""
        ...

    def call_pieces(self, calls: list[ToolCall]) -> list[Piece]:
        """What an assistant turn's calls render to, right after its content."""
        ...

    def tool_result(self, message: Message, roles: Collection[str]) -> tuple[str | None, list[Piece]]:
        """A tool message as (role whose turn framing wraps it, or None for a bare block; body pieces). `roles` are
        the roles the chat template frames."""
        ...

    def parse(self, text: str, tools: dict[str, dict]) -> ParsedTurn:
        """Content and calls of sampled text (stop tokens already removed), checked against tools by name. Never
        raises for any str: every mistake is a ToolCallError the model can act on."""
        ...

    def content_ready(self, text: str) -> tuple[str, bool]:
        """For streaming a turn as it is sampled: (the prefix of `text` that is content whatever comes next, has a
        call begun). Held back: a call, and a tail that may be the start of one (`<tool_` of `<tool_call>`)."""
        ...


HasToken = Callable[[str], bool]  # does the tokenizer have this string as one added token?


def held_back(text: str, starts: Collection[str]) -> tuple[str, bool]:
    """`content_ready` for calls that begin with one of `starts`: the text before the first one (True), or the text
    without its longest tail that begins one of them (False)."""
    hits = [i for i in (text.find(s) for s in starts) if i >= 0]
    if hits:
        return text[:min(hits)], True
    cut = len(text)
    for s in starts:
        k = next((k for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), 0)
        cut = min(cut, len(text) - k)
    return text[:cut], False


# ---------------------------------------------------------------------------------------------- writing calls


def escape_markers(text: str, markers: Collection[str]) -> str:
    """Write each marker's first character as a JSON escape (`<` -> `\\u003c`). Only valid on serialised JSON, where
    a marker can only stand inside a string: the value parses back unchanged and no marker text is left."""
    for marker in markers:
        if marker in text:
            text = text.replace(marker, f"\\u{ord(marker[0]):04x}" + marker[1:])
    return text


def call_json(call: ToolCall, args_key: str, markers: Collection[str]) -> str:
    """`{"name": ..., "<args_key>": {...}}` for one call, with the format's markers escaped."""
    if not isinstance(call, ToolCall):
        raise TypeError(f"a tool call must be a flywheel.types.ToolCall, got {type(call).__name__}")
    if not isinstance(call.arguments, dict):
        raise TypeError(f"tool call {call.name!r}: arguments must be a dict, got {type(call.arguments).__name__}")
    try:
        args = json.dumps(call.arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"tool call {call.name!r}: arguments must be plain JSON values ({e})") from None
    return escape_markers('{"name": ' + json.dumps(call.name, ensure_ascii=False) + f', "{args_key}": ' + args + "}",
                          markers)


# ---------------------------------------------------------------------------------------------- reading calls


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON; use a number or a string")


def loads(text: str) -> Any:
    """json.loads without NaN/Infinity (ValueError, RecursionError propagate)."""
    return json.loads(text, parse_constant=_reject_constant)


def raw_decode(text: str, pos: int) -> tuple[Any, int]:
    """One JSON value starting at `pos` and the index after it (ValueError, RecursionError propagate)."""
    return json.JSONDecoder(parse_constant=_reject_constant).raw_decode(text, pos)


def clip(text: str) -> str:
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "..."


def preview(value: Any, limit: int = 40) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def check_call(obj: Any, tools: dict[str, dict], index: int, raw: str, *, args_keys: tuple[str, ...],
               shape: str) -> ToolCall | ToolCallError:
    """A decoded call object checked against the tools: exactly "name" and one of `args_keys` (the first is the
    canonical one, named in messages), a known tool, arguments that match its schema."""
    raw = clip(raw)
    if not isinstance(obj, dict):
        return ToolCallError("malformed_json", f"a tool call must be a JSON object, got {type_name(obj)}. "
                             f"Write each call as {shape}", raw)
    unknown = [k for k in obj if k != "name" and k not in args_keys]
    if unknown or sum(k in obj for k in args_keys) > 1:
        keys = ", ".join(repr(k) for k in unknown or [k for k in args_keys if k in obj])
        return ToolCallError("malformed_json", f"unexpected key {keys} in tool call; a call has exactly "
                             f'"name" and "{args_keys[0]}": {shape}', raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("malformed_json", f'a tool call needs a "name" string. Write each call as {shape}', raw)
    tool = tools.get(name)
    if tool is None:
        available = ", ".join(sorted(tools)) or "none"
        return ToolCallError("unknown_tool", f"unknown tool {preview(name)}; available tools: {available}", raw)
    key = next((k for k in args_keys if k in obj), args_keys[0])
    args = obj.get(key, {})
    if not isinstance(args, dict):
        return ToolCallError("bad_arguments", f'tool "{name}": "{key}" must be a JSON object, got '
                             f"{type_name(args)} {preview(args)}", raw)
    args, problems = validate_arguments(args, tool.get("parameters", {"type": "object"}))
    if problems:
        return ToolCallError("bad_arguments", f'tool "{name}": ' + "; ".join(problems), raw)
    return ToolCall(name=name, arguments=args, id=f"call_{index}")


def decode_error(err: Exception, raw: str, shape: str) -> ToolCallError:
    """The ToolCallError for JSON that does not decode."""
    if isinstance(err, RecursionError):
        return ToolCallError("malformed_json", f"tool call JSON is nested too deeply. Write each call as {shape}",
                             clip(raw))
    return ToolCallError("malformed_json", f"tool call is not valid JSON ({err}). Write each call as {shape}",
                         clip(raw))


# ---------------------------------------------------------------------------------------------- schema


def _matches(value: Any, t: str) -> tuple[bool, Any]:
    """Does `value` have JSON type `t`? Returns (ok, value), integral floats coerced for "integer"."""
    if t == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool), value
    return type_name(value) == t, value


def validate_arguments(value: Any, schema: dict, where: str = "arguments") -> tuple[Any, list[str]]:
    """Check a JSON value against a (small) JSON schema: type, properties, required, additionalProperties,
    items, enum, minimum/maximum. Returns the value (integral floats made ints) and readable problems."""
    problems: list[str] = []
    types = schema.get("type")
    if types is not None:
        allowed = types if isinstance(types, list) else [types]
        for t in allowed:
            ok, coerced = _matches(value, t)
            if ok:
                value = coerced
                break
        else:
            want = " or ".join(allowed)
            problems.append(f"{where} must be {want}, got {type_name(value)} {preview(value)}")
            return value, problems
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(preview(v) for v in schema["enum"])
        problems.append(f"{where} must be one of {choices}, got {preview(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where} must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where} must be <= {schema['maximum']}, got {value}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                want = props.get(key, {}).get("type", "value")
                problems.append(f"missing required {where}.{key} ({want})" if where != "arguments"
                                else f"missing required argument {key!r} ({want})")
        extra = schema.get("additionalProperties", True)
        out = {}
        for key, item in value.items():
            sub = f"{where}.{key}" if where != "arguments" else f"argument {key!r}"
            if key in props:
                item, more = validate_arguments(item, props[key], sub)
                problems += more
            elif extra is False:
                allowed_keys = ", ".join(props) or "none"
                problems.append(f"unexpected {sub} (allowed: {allowed_keys})")
            elif isinstance(extra, dict):
                item, more = validate_arguments(item, extra, sub)
                problems += more
            out[key] = item
        value = out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for i, item in enumerate(value):
            item, more = validate_arguments(item, schema["items"], f"{where}[{i}]")
            problems += more
            items.append(item)
        value = items
    return value, problems
