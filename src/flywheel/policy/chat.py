"""Chat format: render messages and tool calls to tokens (append-only), parse tool calls out of model text.

    from flywheel.policy.chat import ChatFormat
    chat = ChatFormat(tokenizer, tools=[{"name": "view", "description": "...", "parameters": {...}}],
                      tool_format="auto")                # or "hermes", "llama3_json", "mistral" (model.tool_format)
    prompt = chat.render([Message("system", "..."), Message("user", "Fix the bug.")])  # ends with the assistant header
    turn = chat.parse(tokenizer.decode(sampled_ids))     # ParsedTurn(content, tool_calls, errors); never raises
    prompt += sampled_ids + chat.render_observation([Message("tool", "...", name="view")])

Two parts make a format. The turns (role headers, end-of-turn token) are the model's own: read off its tokenizer's
chat template (policy/chat_template.py), or flywheel's ChatML for flywheel's own tokenizer:

    <|im_start|>system\\n{system text}\\n\\n# Tools\\n{one JSON schema per line}<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{tool output}<|im_end|>\\n
    <|im_start|>assistant\\n

The tool calls are the family's (policy/tool_formats/: Hermes as above, Llama-3 JSON, Mistral [TOOL_CALLS]): how
the system prompt lists the tools, how calls and results are written, how calls are parsed back.

Why it is built this way:
* Tokens are produced piece by piece (frame text, body, tool-call JSON, markers), never by tokenizing the
  whole transcript, so rendering is append-only by construction: the tokens of turn k are a prefix of the
  tokens of turn k+1, and the tokens a model samples for a turn are exactly `assistant_tokens(msg)`.
* Text inside messages is encoded with every added token switched off: a tool output or file that contains the
  string "<|im_end|>" or "[TOOL_CALLS]" becomes ordinary bytes, so no observation can forge a turn boundary or a
  tool call. (With flywheel's tokenizer the text is identical to what its saved HF chat template produces; only
  such adversarial strings and whitespace-only assistant turns tokenize differently there.)
* Marker strings inside tool-call JSON are written with a JSON escape (`\\u003c|im_end|>`), so a call that
  writes this very file still parses back to the same arguments.
* `parse` turns every mistake a model can make into a `ToolCallError` the model can read and act on; nothing
  it sees in generated text raises. Everything a tokenizer can lack is a `TokenizerError`: one line, what to change.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_chat.py tests/unit/test_tool_formats.py`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from flywheel.policy.chat_template import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    ROLES,
    Framing,
    TokenizerError,
    chatml_framing,
    framing_for,
)
from flywheel.policy.tool_formats import TOOL_FORMAT_NAMES, ParsedTurn, Piece, ToolFormat, build_tool_format
from flywheel.policy.tool_formats.base import validate_arguments
from flywheel.policy.tool_formats.hermes import (
    ENDOFTEXT,
    MARKERS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Hermes,
    format_tool_call,
    parse_calls,
)
from flywheel.types import Message, ToolCall

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["CHAT_TEMPLATE", "ENDOFTEXT", "IM_END", "IM_START", "MARKERS", "ROLES", "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN",
           "ChatFormat", "ParsedTurn", "TokenizerError", "chat_pieces", "format_tool_call", "message_from_dict",
           "message_to_dict", "normalize_tools", "parse_turn", "render_chat_text", "validate_arguments"]

_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
# A tokenizer must give back what it encoded, piece by piece: what the model sampled is decoded and parsed.
_ROUND_TRIP = ("def f(x):\n", "    return {'A': [1, 2]}  # ünïcödé 世界 🎉\n\tend")

# ---------------------------------------------------------------------------------------------- tools and messages


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



# ---------------------------------------------------------------------------------------------- rendering

# Internal pieces: (text, kind). TEXT is encoded with markers off; MARKER is a format marker (its token where the
# tokenizer has one, else its text); FRAME is template text, encoded with the tokenizer's special tokens on.
TEXT, MARKER, FRAME = 0, 1, 2
Seg = tuple[str, int]


def _segs(pieces: list[Piece]) -> list[Seg]:
    return [(text, MARKER if is_marker else TEXT) for text, is_marker in pieces]


def _first_turn(frame: Framing, role: str, preamble: list[Piece]) -> list[Seg]:
    start = frame.start.get(role) or frame.header[role]
    header = frame.header.get(role, start)
    if not preamble:
        return [(start, FRAME)]
    if start.endswith(header):  # the preamble stands after BOS (and a default system turn), before the header
        return [(start[: len(start) - len(header)], FRAME), *_segs(preamble), (header, FRAME)]
    return [*_segs(preamble), (start, FRAME)]


def chat_pieces(messages: list[Message], tools: list[dict], fmt: ToolFormat, frame: Framing, eot: str,
                add_generation_prompt: bool = True) -> list[Seg]:
    """The transcript as pieces; tools must already be normalized. `eot` is the end-of-turn string that opens the
    assistant footer (the token the engine stops on)."""
    msgs = [_as_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    system_text = fmt.tools_system_text(tools)
    if system_text and (not msgs or msgs[0].role != "system"):
        msgs = [Message("system", ""), *msgs]
    if msgs and msgs[0].role == "system" and system_text:
        body = f"{msgs[0].content}\n\n{system_text}" if msgs[0].content else system_text
        msgs[0] = Message("system", body)
    if msgs and msgs[0].role == "system" and frame.fold_system:  # no system turn: it opens the first user message
        merge = len(msgs) > 1 and msgs[1].role == "user" and not msgs[1].tool_calls
        text = f"{msgs[0].content}\n\n{msgs[1].content}" if merge else msgs[0].content
        msgs = [Message("user", text), *msgs[2 if merge else 1:]]
    pieces: list[Seg] = []
    preamble = fmt.tools_preamble(tools)
    for i, m in enumerate(msgs):
        pieces += message_pieces(m, fmt, frame, eot, first_preamble=preamble if i == 0 else None)
    if not msgs and preamble:
        pieces += _segs(preamble)
    if add_generation_prompt:
        pieces.append((frame.header["assistant"], FRAME))
    return pieces


def message_pieces(m: Message, fmt: ToolFormat, frame: Framing, eot: str,
                   first_preamble: list[Piece] | None = None) -> list[Seg]:
    """One message in its turn frame. `first_preamble` is not None for the conversation's first message."""
    if m.role == "tool":
        role, body = fmt.tool_result(m, frame.footer.keys() & frame.header.keys())
        if role is None:  # a bare block (Mistral's [TOOL_RESULTS]): no turn of its own
            return (_segs(first_preamble) if first_preamble else []) + _segs(body)
    elif m.role == "assistant":
        role, body = "assistant", [(m.content, False), *fmt.call_pieces(m.tool_calls)]
    else:
        framed = m.role in frame.header or (first_preamble is not None and m.role in frame.start)
        role = m.role if framed else "user"
        body = [(m.content, False)]
    head = _first_turn(frame, role, first_preamble) if first_preamble is not None else [(frame.header[role], FRAME)]
    return head + _segs(body) + _footer(m, fmt, frame, eot, role)


def _footer(m: Message, fmt: ToolFormat, frame: Framing, eot: str, role: str) -> list[Seg]:
    footer = frame.footer[role]
    if role != "assistant":
        return [(footer, FRAME)]
    end: Seg = (fmt.end_of_call, MARKER) if m.tool_calls and fmt.end_of_call else (eot, FRAME)
    return [end, (footer[len(eot):], FRAME)]


def render_chat_text(messages: list[Message], tools: list[dict] | None = None,
                     add_generation_prompt: bool = True) -> str:
    """flywheel's ChatML + Hermes transcript as a string; needs no tokenizer (builds the tokenizer's corpus)."""
    pieces = chat_pieces(messages, normalize_tools(tools), Hermes(), chatml_framing(), IM_END, add_generation_prompt)
    return "".join(text for text, _ in pieces)


def _strip_stops(text: str, stops: tuple[str, ...]) -> str:
    while True:
        for stop in stops:
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
                break
        else:
            return text


def parse_turn(text: str, tools: dict[str, dict]) -> ParsedTurn:
    """Parse flywheel's own (ChatML, Hermes) assistant text against tools (name -> definition). Never raises."""
    if not isinstance(text, str):
        raise TypeError(f"parse expects the decoded text of a turn (str), got {type(text).__name__}")
    return parse_calls(_strip_stops(text, (IM_END, ENDOFTEXT)), tools)


class ChatFormat:
    """Renders messages to token ids append-only and parses assistant text into tool calls.

    `tokenizer` is any fast HF tokenizer: flywheel's own (ChatML turns), or a model's with its chat template (Qwen,
    SmolLM2, Llama 3, Mistral), whose turns are then read off that template; `tools` are {"name", "description",
    "parameters": JSON schema} dicts, listed in the system prompt and used to validate parsed calls;
    `tool_format` names the tool-call convention ("auto": the one the tokenizer's tokens name).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None,
                 tool_format: str = "auto"):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError("the chat format needs a fast (Rust `tokenizers`-backed) Hugging Face tokenizer; save "
                                 "the model's tokenizer with tokenizer.json (`flywheel models import` does)")
        if tool_format not in TOOL_FORMAT_NAMES:
            raise TokenizerError(f"unknown tool format {tool_format!r}; set model.tool_format to one of "
                                 f"{', '.join(TOOL_FORMAT_NAMES)}")
        self.tokenizer = tokenizer
        self.tools = normalize_tools(tools)
        self._tools_by_name = {t["name"]: t for t in self.tools}
        self._backend = backend
        # A copy of the tokenizer with no added tokens: text inside messages can never become a marker.
        spec = json.loads(backend.to_str())
        spec["added_tokens"] = []
        spec["post_processor"] = None
        self._plain: Tokenizer = Tokenizer.from_str(json.dumps(spec))
        self._plain.no_truncation()
        self._plain.no_padding()
        self._cache: dict[str, list[int]] = {}
        self._frame_cache: dict[str, list[int]] = {}
        self.framing = framing_for(tokenizer, self.has_token)
        self.tool_format: ToolFormat = build_tool_format(tool_format, self.has_token)
        self._eot = self._end_of_turn()
        self._check_round_trip()
        # Markers are single tokens where the tokenizer has them (no text can then forge them), plain text otherwise
        # (SmolLM2 has no <tool_call> token): the model writes them as it writes any text, and calls are only ever
        # parsed from what it sampled.
        self.marker_ids: dict[str, int] = {}
        self.marker_tokens: dict[str, list[int]] = {}
        for marker in (IM_START, IM_END, ENDOFTEXT) if self.framing.source == "chatml" else (self._eot,):
            if self.has_token(marker):
                self.marker_ids[marker] = self._backend.token_to_id(marker)
        for marker in (*self.tool_format.markers, *(m for m in [self.tool_format.end_of_call] if m)):
            if self.has_token(marker):
                self.marker_ids[marker] = self._backend.token_to_id(marker)
                self.marker_tokens[marker] = [self.marker_ids[marker]]
                continue
            ids = self._plain.encode(marker, add_special_tokens=False).ids
            back = tokenizer.decode(ids, skip_special_tokens=False)
            if back != marker:
                raise TokenizerError(
                    f"the tokenizer cannot carry the {self.tool_format.name} tool format's marker {marker!r}: it is "
                    f"not one token, and as text it decodes back as {back!r}. Set model.tool_format to another "
                    f"format ({', '.join(TOOL_FORMAT_NAMES)}), or add {marker!r} to the tokenizer as a token")
            self.marker_tokens[marker] = ids
        self.tool_tags_are_tokens = TOOL_CALL_OPEN in self.marker_ids and TOOL_CALL_CLOSE in self.marker_ids
        eos = getattr(tokenizer, "eos_token_id", None)
        end_of_call = self.tool_format.end_of_call
        stops = [self._backend.token_to_id(self._eot), self.marker_ids.get(end_of_call) if end_of_call else None,
                 self._backend.token_to_id(ENDOFTEXT) if self.has_token(ENDOFTEXT) else None,
                 eos if isinstance(eos, int) else None]
        self._stop_ids = list(dict.fromkeys(i for i in stops if i is not None))
        self._stop_texts = tuple(dict.fromkeys(str(tokenizer.decode([i], skip_special_tokens=False))
                                               for i in self._stop_ids))

    # ------------------------------------------------------------------------------------------ tokenizer checks
    def has_token(self, text: str) -> bool:
        """Is `text` exactly one token of the tokenizer (an added or special token)?"""
        tid = self._backend.token_to_id(text)
        return tid is not None and self._backend.encode(text, add_special_tokens=False).ids == [tid]

    def _end_of_turn(self) -> str:
        footer = self.framing.footer["assistant"]
        added = sorted((t.content for t in self._backend.get_added_tokens_decoder().values()
                        if footer.startswith(t.content)), key=len, reverse=True)
        if not added:
            raise TokenizerError(f"the tokenizer's chat template ends an assistant turn with {footer!r}, which does "
                                 "not begin with a special token: the engine has no end-of-turn token to stop on. "
                                 "Add the model's end-of-turn token (<|im_end|>, <|eot_id|>, </s>) to the tokenizer "
                                 "as a special token, or use the model's own tokenizer.json")
        return added[0]

    def _check_round_trip(self) -> None:
        ids = [i for part in _ROUND_TRIP for i in self.encode_text(part)]
        back = self.tokenizer.decode(ids, skip_special_tokens=False)
        if back != "".join(_ROUND_TRIP):
            raise TokenizerError(f"the tokenizer does not round-trip text: {''.join(_ROUND_TRIP)!r} encoded piece by "
                                 f"piece decodes back as {back!r}. flywheel parses what the model sampled from its "
                                 "decoded text and renders turns piece by piece, so it needs decode(encode(a) + "
                                 "encode(b)) == a + b: use a byte-level BPE tokenizer (no normalizer, no added "
                                 "prefix space), such as the model's own tokenizer.json")

    # ------------------------------------------------------------------------------------------ rendering
    @property
    def stop_token_ids(self) -> list[int]:
        """The end-of-turn token first, then the format's end of a call turn, <|endoftext|> and the eos."""
        return list(self._stop_ids)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text, with marker strings treated as ordinary characters."""
        if len(text) <= 32:  # role headers, newlines: cached
            ids = self._cache.get(text)
            if ids is None:
                ids = self._cache[text] = self._plain.encode(text, add_special_tokens=False).ids
            return list(ids)
        return self._plain.encode(text, add_special_tokens=False).ids

    def _encode(self, pieces: list[Seg]) -> list[int]:
        ids: list[int] = []
        for text, kind in pieces:
            if not text:
                continue
            if kind == MARKER:
                ids += self.marker_tokens[text]
            elif kind == FRAME:
                frame = self._frame_cache.get(text)
                if frame is None:
                    frame = self._frame_cache[text] = self._backend.encode(text, add_special_tokens=False).ids
                ids += frame
            else:
                ids += self.encode_text(text)
        return ids

    def _pieces(self, messages: list[Message], add_generation_prompt: bool) -> list[Seg]:
        return chat_pieces(messages, self.tools, self.tool_format, self.framing, self._eot, add_generation_prompt)

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the transcript; with `add_generation_prompt` it ends with the assistant header."""
        return self._encode(self._pieces(messages, add_generation_prompt))

    def render_text(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        """The transcript as a string (for flywheel's tokenizer: identical to its saved HF chat template's output)."""
        return "".join(text for text, _ in self._pieces(messages, add_generation_prompt))

    def render_observation(self, messages: list[Message]) -> list[int]:
        """Tokens appended after a sampled assistant turn (which ended with its end-of-turn token): the rest of the
        assistant footer ("\\n" in ChatML), the observation blocks, then the next assistant header."""
        pieces: list[Seg] = [(self.framing.footer["assistant"][len(self._eot):], FRAME)]
        for i, m in enumerate(messages):
            m = _as_message(m, f"observation[{i}]")
            if m.role == "assistant":
                raise ValueError("observations are tool/user/system messages; assistant turns are sampled, "
                                 "append them with assistant_tokens()")
            pieces += message_pieces(m, self.tool_format, self.framing, self._eot)
        pieces.append((self.framing.header["assistant"], FRAME))
        return self._encode(pieces)

    def assistant_tokens(self, message: Message) -> list[int]:
        """What a model samples for this assistant message: content, tool calls, the end-of-turn token."""
        m = _as_message(message, "message")
        if m.role != "assistant":
            raise ValueError(f"assistant_tokens needs an assistant message, got role {m.role!r}")
        pieces = message_pieces(m, self.tool_format, self.framing, self._eot)
        return self._encode(pieces[1:-1])  # without the header and the rest of the footer

    # ------------------------------------------------------------------------------------------ parsing
    def parse(self, text: str) -> ParsedTurn:
        """Split generated text into content and tool calls; every unusable call becomes a ToolCallError."""
        if not isinstance(text, str):
            raise TypeError(f"parse expects the decoded text of a turn (str), got {type(text).__name__}")
        return self.tool_format.parse(_strip_stops(text, self._stop_texts), self._tools_by_name)
