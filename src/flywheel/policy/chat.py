"""Chat format: render messages and tool calls to tokens (append-only), parse tool calls out of model text.

    from flywheel.policy.chat import ChatFormat
    chat = ChatFormat(tokenizer, tools=[{"name": "view", "description": "...", "parameters": {...}}])
    prompt = chat.render([Message("system", "..."), Message("user", "Fix the bug.")])  # ends with the assistant header
    turn = chat.parse(tokenizer.decode(sampled_ids))     # ParsedTurn(content, tool_calls, errors); never raises
    prompt += sampled_ids + chat.render_observation([Message("tool", "...", name="view")])

The format is ChatML with Qwen-style tool calls, so a real Qwen checkpoint's tokenizer works unchanged:

    <|im_start|>system\\n{system text}\\n\\n# Tools\\n{one JSON schema per line}<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{tool output}<|im_end|>\\n
    <|im_start|>assistant\\n

Why it is built this way:
* Tokens are produced piece by piece (role header, body, tool-call JSON, markers), never by tokenizing the
  whole transcript, so rendering is append-only by construction: the tokens of turn k are a prefix of the
  tokens of turn k+1, and the tokens a model samples for a turn are exactly `assistant_tokens(msg)`.
* Text inside messages is encoded with the markers switched off: a tool output or file that contains the
  string "<|im_end|>" becomes ordinary bytes, so no observation can forge a turn boundary or a tool call.
  (The text is identical to what the Hugging Face chat template saved with the tokenizer produces; only such
  adversarial strings and whitespace-only assistant turns tokenize differently there.)
* Marker strings inside tool-call JSON are written with a JSON escape (`\\u003c|im_end|>`), so a call that
  writes this very file still parses back to the same arguments.
* `parse` turns every mistake a model can make into a `ToolCallError` the model can read and act on; nothing
  it sees in generated text raises.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_chat.py`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from flywheel.config import ConfigError
from flywheel.types import Message, ToolCall, ToolCallError

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MARKERS = (ENDOFTEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
ROLES = ("system", "user", "assistant", "tool")
_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
_CALL_SHAPE = f'{TOOL_CALL_OPEN}{{"name": "<tool name>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}'
_MAX_RAW_CHARS = 2000  # raw text kept in a ToolCallError (for logs); the model reads `message`

# The Hugging Face chat template saved with the tokenizer; it must produce exactly `render_chat_text`'s string
# (tested with `tokenizer.apply_chat_template`). Accepts both our tool/call dicts and the OpenAI-style
# {"type": "function", "function": {...}} wrappers that transformers users pass.
CHAT_TEMPLATE = r"""
{%- set ns = namespace(tools='') -%}
{%- if tools -%}
  {%- for tool in tools -%}
    {%- set t = tool.function if tool.function is defined else tool -%}
    {%- set ns.tools = ns.tools ~ '\n' ~ (t | tojson) -%}
  {%- endfor -%}
  {%- set ns.tools = '# Tools' ~ ns.tools -%}
{%- endif -%}
{%- if ns.tools and (not messages or messages[0].role != 'system') -%}
  {{- '<|im_start|>system\n' ~ ns.tools ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {{- '<|im_start|>' ~ message.role ~ '\n' -}}
  {%- if loop.first and message.role == 'system' and ns.tools -%}
    {{- (content ~ '\n\n' ~ ns.tools) if content else ns.tools -}}
  {%- else -%}
    {{- content -}}
  {%- endif -%}
  {%- if message.role == 'assistant' and message.tool_calls -%}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- set args = fn.arguments if fn.arguments is defined else {} -%}
      {%- set args = args if args is string else (args | tojson) -%}
      {%- set js = '{"name": ' ~ (fn.name | tojson) ~ ', "arguments": ' ~ args ~ '}' -%}
      {%- set js = js | replace('<|endoftext|>', '\\u003c|endoftext|>') -%}
      {%- set js = js | replace('<|im_start|>', '\\u003c|im_start|>') -%}
      {%- set js = js | replace('<|im_end|>', '\\u003c|im_end|>') | replace('<tool_call>', '\\u003ctool_call>') -%}
      {%- set js = js | replace('</tool_call>', '\\u003c/tool_call>') -%}
      {{- '<tool_call>' ~ js ~ '</tool_call>' -}}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()


class TokenizerError(ConfigError):
    """The model's tokenizer cannot carry flywheel's chat format; the message says what to change. A ConfigError:
    the command line prints it as one line (the model directory is the user's choice)."""


@dataclass
class ParsedTurn:
    """What an assistant turn said: free text, the usable tool calls, and one error per unusable call."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    # `content` with each unusable call's own text left where it stood: what an API client is shown, so that a
    # call to a tool the request did not declare reads as the text the model wrote, never as an empty message
    shown: str = ""


# ---------------------------------------------------------------------------------------------- rendering


def _escape_markers(text: str) -> str:
    # Markers can only occur inside JSON strings here, where "\u003c" is an exact stand-in for "<".
    for marker in MARKERS:
        if marker in text:
            text = text.replace(marker, "\\u003c" + marker[1:])
    return text


def format_tool_call(call: ToolCall) -> str:
    """The canonical JSON of one call, `{"name": ..., "arguments": {...}}`, without the <tool_call> tags."""
    if not isinstance(call, ToolCall):
        raise TypeError(f"format_tool_call expects a flywheel.types.ToolCall, got {type(call).__name__}")
    if not isinstance(call.arguments, dict):
        raise TypeError(f"tool call {call.name!r}: arguments must be a dict, got {type(call.arguments).__name__}")
    try:
        args = json.dumps(call.arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"tool call {call.name!r}: arguments must be plain JSON values ({e})") from None
    return _escape_markers('{"name": ' + json.dumps(call.name, ensure_ascii=False) + ', "arguments": ' + args + "}")


def normalize_tools(tools: list[dict] | None) -> list[dict]:
    """Check tool definitions ({"name", "description", "parameters"}); unwrap {"type": "function", "function": …}."""
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"tools must be a list of dicts, got {type(tools).__name__}")
    out: list[dict] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tool = tool["function"]
        if not isinstance(tool, dict):
            raise TypeError(f"tools[{i}] must be a dict with 'name', 'description', 'parameters'; got {tool!r:.80}")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}] needs a non-empty string 'name'")
        if any(t["name"] == name for t in out):
            raise ValueError(f"tool name {name!r} is defined twice; tool names must be unique")
        params = tool.get("parameters", {"type": "object"})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ValueError(f"tool {name!r}: 'parameters' must be a JSON schema of type 'object'")
        _check_schema(params, f"tool {name!r} parameters")
        try:
            json.dumps(tool, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"tool {name!r} must be JSON-serialisable ({e})") from None
        out.append(tool)
    return out


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a JSON schema must be a dict, got {schema!r:.80}")
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types is not None else []:
        if t not in _JSON_TYPES:
            raise ValueError(f"{where}: unsupported type {t!r}; use one of {', '.join(_JSON_TYPES)}")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{where}: 'properties' must be a dict")
    for key, sub in props.items():
        _check_schema(sub, f"{where}.{key}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{where}: 'required' must be a list of property names")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}[]")
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        _check_schema(extra, f"{where}.*")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}: 'enum' must be a list")
    for bound in ("minimum", "maximum"):
        if bound in schema and (isinstance(schema[bound], bool) or not isinstance(schema[bound], (int, float))):
            raise ValueError(f"{where}: {bound!r} must be a number")


def _tools_text(tools: list[dict]) -> str:
    if not tools:
        return ""
    return "# Tools\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def _as_message(m: Any, where: str) -> Message:
    if isinstance(m, dict):
        m = message_from_dict(m)
    if not isinstance(m, Message):
        raise TypeError(f"{where} must be a flywheel.types.Message (or a chat dict), got {type(m).__name__}")
    if m.role not in ROLES:
        raise ValueError(f"{where}: role {m.role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(m.content, str):
        raise TypeError(f"{where}: content must be a str, got {type(m.content).__name__}")
    if m.tool_calls and m.role != "assistant":
        raise ValueError(f"{where}: only assistant messages carry tool_calls (role is {m.role!r})")
    return m


# A piece is (text, is_marker): markers become one token each, other text is encoded with markers off.
Piece = tuple[str, bool]


def _message_pieces(m: Message, tools_text: str, first: bool) -> list[Piece]:
    pieces: list[Piece] = [(IM_START, True), (m.role + "\n", False)]
    body = m.content
    if first and m.role == "system" and tools_text:
        body = f"{body}\n\n{tools_text}" if body else tools_text
    pieces += _body_pieces(m) if m.role == "assistant" else [(body, False)]
    return pieces + [(IM_END, True), ("\n", False)]


def _body_pieces(m: Message) -> list[Piece]:
    pieces: list[Piece] = [(m.content, False)]
    for call in m.tool_calls:
        pieces += [(TOOL_CALL_OPEN, True), (format_tool_call(call), False), (TOOL_CALL_CLOSE, True)]
    return pieces


def chat_pieces(messages: list[Message], tools: list[dict], add_generation_prompt: bool = True) -> list[Piece]:
    """The transcript as marker/text pieces; tools must already be normalized."""
    messages = [_as_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    tools_text = _tools_text(tools)
    pieces: list[Piece] = []
    if tools_text and (not messages or messages[0].role != "system"):
        pieces += [(IM_START, True), ("system\n", False), (tools_text, False), (IM_END, True), ("\n", False)]
    for i, m in enumerate(messages):
        pieces += _message_pieces(m, tools_text, first=i == 0)
    if add_generation_prompt:
        pieces += [(IM_START, True), ("assistant\n", False)]
    return pieces


def render_chat_text(messages: list[Message], tools: list[dict] | None = None,
                     add_generation_prompt: bool = True) -> str:
    """The transcript as a string; needs no tokenizer (used to build the tokenizer's training corpus)."""
    return "".join(text for text, _ in chat_pieces(messages, normalize_tools(tools), add_generation_prompt))


def message_to_dict(m: Message) -> dict[str, Any]:
    """A Message as the dict transformers' `apply_chat_template` (and OpenAI-style APIs) expect."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in m.tool_calls]
    if m.name:
        d["name"] = m.name
    return d


def message_from_dict(d: dict[str, Any]) -> Message:
    """Inverse of `message_to_dict`; also accepts flat {"name", "arguments"} calls and JSON-string arguments."""
    calls = []
    for c in d.get("tool_calls") or []:
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise TypeError(f"tool_calls entries must be dicts, got {c!r:.80}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise ValueError(f"tool call arguments string is not JSON ({e}): {args!r:.80}") from None
        calls.append(ToolCall(name=fn.get("name", ""), arguments=args, id=c.get("id", "") or ""))
    return Message(role=d.get("role", ""), content=d.get("content") or "", tool_calls=calls, name=d.get("name") or "")


class ChatFormat:
    """Renders messages to token ids append-only and parses assistant text into tool calls.

    `tokenizer` is any fast HF tokenizer with <|im_start|> and <|im_end|> as single tokens (ours, Qwen's,
    SmolLM2's); <tool_call> and </tool_call> are single tokens where the tokenizer has them, else plain text;
    `tools` are {"name", "description", "parameters": JSON schema} dicts, listed in the system message and
    used to validate parsed calls.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError("the chat format needs a fast (Rust `tokenizers`-backed) Hugging Face tokenizer; save "
                             "the model's tokenizer with tokenizer.json (`flywheel models import` does)")
        self.tokenizer = tokenizer
        self.tools = normalize_tools(tools)
        self._tools_by_name = {t["name"]: t for t in self.tools}
        # A copy of the tokenizer with no added tokens: text inside messages can never become a marker.
        spec = json.loads(backend.to_str())
        spec["added_tokens"] = []
        spec["post_processor"] = None
        self._plain: Tokenizer = Tokenizer.from_str(json.dumps(spec))
        self._plain.no_truncation()
        self._plain.no_padding()
        self._cache: dict[str, list[int]] = {}
        # Turn markers must be single tokens (no text can then forge a turn boundary); the tool-call tags may be
        # plain text (SmolLM2 has no such tokens): the model writes them as it writes any text, and calls are only
        # ever parsed from what it sampled. <|endoftext|> is optional (the tokenizer's eos stops a turn too).
        self.marker_ids: dict[str, int] = {}
        self.marker_tokens: dict[str, list[int]] = {}
        for marker in MARKERS:
            ids = backend.encode(marker, add_special_tokens=False).ids
            if len(ids) == 1 and backend.token_to_id(marker) == ids[0]:
                self.marker_ids[marker] = ids[0]
                self.marker_tokens[marker] = ids
            elif marker in (IM_START, IM_END):
                raise TokenizerError(f"the tokenizer has no {marker!r} token: flywheel renders ChatML turns, whose "
                                 "markers must be single tokens, so this model cannot be prompted or trained in "
                                 "flywheel's harness. Pick a model with a ChatML chat template (Qwen2, Qwen3, "
                                 "SmolLM2); a model trained from scratch gets one from flywheel (leave "
                                 "tokenizer.path unset)")
            elif marker != ENDOFTEXT:
                self.marker_tokens[marker] = self._plain.encode(marker, add_special_tokens=False).ids
        self.tool_tags_are_tokens = TOOL_CALL_OPEN in self.marker_ids and TOOL_CALL_CLOSE in self.marker_ids
        eos = getattr(tokenizer, "eos_token_id", None)
        stops = [self.marker_ids[IM_END], self.marker_ids.get(ENDOFTEXT), eos if isinstance(eos, int) else None]
        self._stop_ids = list(dict.fromkeys(i for i in stops if i is not None))

    # ------------------------------------------------------------------------------------------ rendering
    @property
    def stop_token_ids(self) -> list[int]:
        """<|im_end|>, then <|endoftext|> and the tokenizer's eos where they exist."""
        return list(self._stop_ids)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text, with marker strings treated as ordinary characters."""
        if len(text) <= 32:  # role headers, newlines: cached
            ids = self._cache.get(text)
            if ids is None:
                ids = self._cache[text] = self._plain.encode(text, add_special_tokens=False).ids
            return list(ids)
        return self._plain.encode(text, add_special_tokens=False).ids

    def _encode(self, pieces: list[Piece]) -> list[int]:
        ids: list[int] = []
        for text, is_marker in pieces:
            if is_marker:
                ids += self.marker_tokens[text]
            elif text:
                ids += self.encode_text(text)
        return ids

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the transcript; with `add_generation_prompt` it ends with the assistant header."""
        return self._encode(chat_pieces(messages, self.tools, add_generation_prompt))

    def render_text(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        """The transcript as a string: identical to the saved HF chat template's output."""
        return "".join(text for text, _ in chat_pieces(messages, self.tools, add_generation_prompt))

    def render_observation(self, messages: list[Message]) -> list[int]:
        """Tokens appended after a sampled assistant turn (which ended with <|im_end|>): "\\n", the
        observation blocks, then the next assistant header."""
        pieces: list[Piece] = [("\n", False)]
        for i, m in enumerate(messages):
            m = _as_message(m, f"observation[{i}]")
            if m.role == "assistant":
                raise ValueError("observations are tool/user/system messages; assistant turns are sampled, "
                                 "append them with assistant_tokens()")
            pieces += _message_pieces(m, "", first=False)
        pieces += [(IM_START, True), ("assistant\n", False)]
        return self._encode(pieces)

    def assistant_tokens(self, message: Message) -> list[int]:
        """What a model samples for this assistant message: content, tool calls, <|im_end|>."""
        m = _as_message(message, "message")
        if m.role != "assistant":
            raise ValueError(f"assistant_tokens needs an assistant message, got role {m.role!r}")
        return self._encode(_body_pieces(m) + [(IM_END, True)])

    # ------------------------------------------------------------------------------------------ parsing
    def parse(self, text: str) -> ParsedTurn:
        """Split generated text into content and tool calls; every unusable call becomes a ToolCallError."""
        return parse_turn(text, self._tools_by_name)


# ---------------------------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON; use a number or a string")


def _preview(value: Any, limit: int = 40) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
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


def _matches(value: Any, t: str) -> tuple[bool, Any]:
    """Does `value` have JSON type `t`? Returns (ok, value), integral floats coerced for "integer"."""
    if t == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool), value
    return _type_name(value) == t, value


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
            problems.append(f"{where} must be {want}, got {_type_name(value)} {_preview(value)}")
            return value, problems
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(_preview(v) for v in schema["enum"])
        problems.append(f"{where} must be one of {choices}, got {_preview(value)}")
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


def _parse_call(body: str, tools: dict[str, dict], index: int) -> ToolCall | ToolCallError:
    raw = body if len(body) <= _MAX_RAW_CHARS else body[:_MAX_RAW_CHARS] + "..."
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        return ToolCallError("malformed_json", "tool call JSON is nested too deeply. "
                             f"Write each call as {_CALL_SHAPE}", raw)
    except ValueError as e:  # JSONDecodeError, NaN, integers too long to convert
        return ToolCallError("malformed_json", f"tool call is not valid JSON ({e}). Write each call as {_CALL_SHAPE}",
                             raw)
    if not isinstance(obj, dict):
        return ToolCallError("malformed_json", f"a tool call must be a JSON object, got {_type_name(obj)}. "
                             f"Write each call as {_CALL_SHAPE}", raw)
    unknown = [k for k in obj if k not in ("name", "arguments")]
    if unknown:
        keys = ", ".join(repr(k) for k in unknown)
        return ToolCallError("malformed_json", f"unexpected key {keys} in tool call; a call has exactly "
                             f'"name" and "arguments": {_CALL_SHAPE}', raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("malformed_json", f'a tool call needs a "name" string. Write each call as {_CALL_SHAPE}',
                             raw)
    tool = tools.get(name)
    if tool is None:
        available = ", ".join(sorted(tools)) or "none"
        return ToolCallError("unknown_tool", f"unknown tool {_preview(name)}; available tools: {available}", raw)
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return ToolCallError("bad_arguments", f'tool "{name}": "arguments" must be a JSON object, got '
                             f"{_type_name(args)} {_preview(args)}", raw)
    args, problems = validate_arguments(args, tool.get("parameters", {"type": "object"}))
    if problems:
        return ToolCallError("bad_arguments", f'tool "{name}": ' + "; ".join(problems), raw)
    return ToolCall(name=name, arguments=args, id=f"call_{index}")


def _strip_stops(text: str) -> str:
    while True:
        for stop in (IM_END, ENDOFTEXT):
            if text.endswith(stop):
                text = text[: -len(stop)]
                break
        else:
            return text


def parse_turn(text: str, tools: dict[str, dict]) -> ParsedTurn:
    """Parse assistant text against tools (name -> definition). Never raises for any str."""
    if not isinstance(text, str):
        raise TypeError(f"parse expects the decoded text of a turn (str), got {type(text).__name__}")
    text = _strip_stops(text)
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
                                             f"{TOOL_CALL_OPEN}. Write each call as {_CALL_SHAPE}",
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
                                             f"with {TOOL_CALL_CLOSE}: {_CALL_SHAPE}", body[:_MAX_RAW_CHARS]))
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
