"""The OpenAI chat-completions wire format: request validation and response bodies. Pure functions.

    req = parse_chat_request(body_json, model_name="flywheel", max_tokens_cap=256, default_max_tokens=128)
    req.messages, req.tools, req.sampling, req.stream            # or ApiError(400, "...") naming the field
    completion_body(cid, "flywheel", version, parsed, finish_reason, usage)

Every mistake a client can make becomes an `ApiError` with an HTTP status, an OpenAI-style error type and a
message that names the field and what is allowed; nothing in a request body raises anything else. Tool calls
in assistant messages (`{"id", "type": "function", "function": {"name", "arguments": "<json>"}}`) and tool
results (`{"role": "tool", "tool_call_id"}`) map onto flywheel's Message/ToolCall, so a client's multi-turn
transcript renders through the same chat format (policy/chat.py) the policy was trained on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from flywheel.policy.chat import ParsedTurn
from flywheel.types import Message, SamplingParams, ToolCall

ROLES = ("system", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the server refuses: `status` (4xx), OpenAI error `type`, and a message saying what to change."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict]
    sampling: SamplingParams
    stream: bool = False
    model: str = ""
    user: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def _bad(msg: str, param: str | None = None) -> ApiError:
    return ApiError(400, msg, param=param)


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise _bad(f"'{name}' must be a number, got {json.dumps(v)[:40]}", name)
    if (v <= lo if lo_open else v < lo) or v > hi:
        raise _bad(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", name)
    return float(v)


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # [{"type": "text", "text": "..."}]
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise _bad(f"messages[{i}].content[{j}] must be {{'type': 'text', 'text': str}} (only text is "
                           f"served)", f"messages[{i}].content")
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _tool_calls(m: dict, i: int, names: dict[str, str]) -> list[ToolCall]:
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}", where)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError as err:
                raise _bad(f"{where}.function.arguments is not valid JSON ({err.msg})", where) from None
        if not isinstance(args, dict):
            raise _bad(f"{where}.function.arguments must be a JSON object", where)
        call_id = str(c.get("id") or "")
        if call_id:
            names[call_id] = fn["name"]
        out.append(ToolCall(fn["name"], args, call_id))
    return out


def parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list of {'role', 'content'} objects", "messages")
    names: dict[str, str] = {}  # tool_call_id -> tool name, from earlier assistant turns
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {list(ROLES)}, got {json.dumps(role)[:40]}",
                       f"messages[{i}].role")
        text = _content(m, i)
        if role == "assistant":
            out.append(Message("assistant", text, _tool_calls(m, i, names)))
        elif role == "tool":
            name = names.get(str(m.get("tool_call_id") or ""), str(m.get("name") or ""))
            out.append(Message("tool", text, name=name))
        else:
            out.append(Message(role, text))
    if out[-1].role == "assistant":
        raise _bad("the last message is the assistant's; end with a user or tool message to get a reply", "messages")
    return out


def parse_tools(raw: Any) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list of {'type': 'function', 'function': {...}}", "tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'description', "
                       f"'parameters'}}}}", f"tools[{i}]")
        out.append({"name": fn["name"], "description": str(fn.get("description") or ""),
                    "parameters": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out


def parse_chat_request(body: Any, model_name: str, max_tokens_cap: int, default_max_tokens: int) -> ChatRequest:
    """Validate a /v1/chat/completions body; ApiError(400/404) names the first wrong field."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model != model_name:
        raise ApiError(404, f"model {json.dumps(model)[:80]} is not served here; use '{model_name}' (GET /v1/models)",
                       "not_found_error", "model")
    n = body.get("n", 1)
    if n != 1:
        raise _bad("only n = 1 is served (one sample per request: each is a training sample of its own)", "n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is None:
        mt = min(default_max_tokens, max_tokens_cap)
    if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= max_tokens_cap:
        raise _bad(f"'max_tokens' must be an integer in [1, {max_tokens_cap}], got {json.dumps(mt)[:40]}",
                   "max_tokens")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise _bad("'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise _bad("'seed' must be a non-negative integer", "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", "stream")
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice not in ("auto", "none", None):
        raise _bad("'tool_choice' may be 'auto' or 'none' (the policy decides when to call a tool)", "tool_choice")
    tools = [] if tool_choice == "none" else parse_tools(body.get("tools"))
    user = body.get("user") or ""
    if not isinstance(user, str):
        raise _bad("'user' must be a string", "user")
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=mt, stop=list(stop), seed=seed)
    return ChatRequest(parse_messages(body.get("messages")), tools, sampling, stream, model, user)


def finish_reason(engine_reason: str, parsed: ParsedTurn) -> str:
    if parsed.tool_calls:
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def tool_calls_json(parsed: ParsedTurn, completion_id: str) -> list[dict[str, Any]]:
    return [{"id": f"call_{completion_id[-12:]}_{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for i, c in enumerate(parsed.tool_calls)]


def completion_body(cid: str, model: str, version: int, parsed: ParsedTurn, reason: str,
                    usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.tool_calls:
        message["tool_calls"] = tool_calls_json(parsed, cid)
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": f"flywheel-v{version}", "weight_version": version,
            "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
            "usage": usage}


def chunk_body(cid: str, model: str, version: int, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "system_fingerprint": f"flywheel-v{version}", "weight_version": version,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]}
