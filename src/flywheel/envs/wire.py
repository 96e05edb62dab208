"""The env-server's wire format: messages, tool calls and rewards as JSON, checked on the way in.

    body = {"tool_calls": [call_to_json(c) for c in calls], "errors": [error_to_json(e) for e in errors]}
    calls, errors = calls_from_json(body)          # ValueError naming the bad field (the server answers 400)
    reward = reward_from_json(payload["reward"])   # ValueError on anything that is not a well-formed reward

Why strict on both sides: the server must answer a malformed request with a 4xx that says what is wrong, and
the client must never turn a malformed answer (a proxy's error page, a truncated body) into a reward: a reward
that does not parse is an environment failure. Used by `remote_server.py` and `remote_client.py`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from flywheel.types import Message, Reward, ToolCall, ToolCallError

ROLES = ("system", "user", "assistant", "tool")
ERROR_KINDS = ("malformed_json", "unknown_tool", "bad_arguments")


def _obj(x: Any, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ValueError(f"{what} must be a JSON object (got {type(x).__name__})")
    return x


def _str(d: dict[str, Any], key: str, what: str, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str):
        raise ValueError(f"{what}.{key} must be a string (got {type(v).__name__})")
    return v


def call_to_json(c: ToolCall) -> dict[str, Any]:
    return {"name": c.name, "arguments": c.arguments, "id": c.id}


def error_to_json(e: ToolCallError) -> dict[str, Any]:
    return {"kind": e.kind, "message": e.message, "raw": e.raw}


def calls_from_json(body: Any) -> tuple[list[ToolCall], list[ToolCallError]]:
    """A step request's `tool_calls` and `errors`. A call's arguments may be any JSON object: the harness
    checks them and answers a bad one with an error observation, as in-process."""
    body = _obj(body, "the step request")
    raw_calls, raw_errors = body.get("tool_calls", []), body.get("errors", [])
    if not isinstance(raw_calls, list) or not isinstance(raw_errors, list):
        raise ValueError("'tool_calls' and 'errors' must be JSON arrays")
    calls = []
    for i, c in enumerate(raw_calls):
        c = _obj(c, f"tool_calls[{i}]")
        args = c.get("arguments", {})
        if not isinstance(args, dict):
            raise ValueError(f"tool_calls[{i}].arguments must be a JSON object")
        calls.append(ToolCall(_str(c, "name", f"tool_calls[{i}]"), args, _str(c, "id", f"tool_calls[{i}]", "")))
    errors = []
    for i, e in enumerate(raw_errors):
        e = _obj(e, f"errors[{i}]")
        kind = e.get("kind")
        if kind not in ERROR_KINDS:
            raise ValueError(f"errors[{i}].kind must be one of {ERROR_KINDS} (got {kind!r})")
        errors.append(ToolCallError(kind, _str(e, "message", f"errors[{i}]"), _str(e, "raw", f"errors[{i}]", "")))
    return calls, errors


def message_to_json(m: Message) -> dict[str, Any]:
    return {"role": m.role, "content": m.content, "name": m.name,
            "tool_calls": [call_to_json(c) for c in m.tool_calls]}


def messages_from_json(items: Any) -> list[Message]:
    if not isinstance(items, list):
        raise ValueError("'messages' must be a JSON array")
    out = []
    for i, m in enumerate(items):
        m = _obj(m, f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {ROLES} (got {role!r})")
        calls, _ = calls_from_json({"tool_calls": m.get("tool_calls", [])})
        out.append(Message(role, _str(m, "content", f"messages[{i}]"), calls, _str(m, "name", f"messages[{i}]", "")))
    return out


def reward_to_json(r: Reward) -> dict[str, Any]:
    return dataclasses.asdict(r)


def reward_from_json(d: Any) -> Reward:
    """A reward as the server sent it; ValueError unless every field has its type (and numbers are finite)."""
    d = _obj(d, "reward")
    value = d.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"reward.value must be a finite number (got {value!r})")
    comps, flags, tests, notes = (d.get(k) for k in ("components", "flags", "tests", "notes"))
    if not isinstance(comps, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) for k, v in comps.items()):
        raise ValueError("reward.components must map names to numbers")
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ValueError("reward.flags must be a list of strings")
    if not isinstance(tests, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tests.items()):
        raise ValueError("reward.tests must map test ids to statuses")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError("reward.notes must be a list of strings")
    return Reward(float(value), {k: float(v) for k, v in comps.items()}, list(flags), dict(tests), list(notes))
