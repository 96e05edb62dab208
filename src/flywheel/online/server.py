"""`flywheel serve`'s HTTP API: OpenAI-compatible chat completions on flywheel's engine, feedback, models.

    app = build_app(ServingState(engine, tokenizer, elog, cfg.online.serve))
    POST /v1/chat/completions   (tools, streaming; every reply carries its completion id and `weight_version`)
    POST /v1/feedback           {"completion_id", "signal": "accept"|"reject"|..., "message"?, "diff"?}
    GET  /v1/models, GET /v1/flywheel/status, GET /health
    client = openai.OpenAI(base_url="http://127.0.0.1:8470/v1", api_key=key)   # the official client works as is

Why aiohttp: the project already serves its dashboard with it, it streams (server-sent events) with plain
`StreamResponse` writes, and the engine's futures live on the same asyncio loop, so no second HTTP stack or worker
process sits between a request and the engine. Token ids in, token ids out: the prompt is rendered by the policy's
chat format (append-only, policy/chat.py), the engine returns the sampled ids with their log-probs and versions,
and those exact ids are stored, so the learner never trains on a re-tokenization of the reply text.

Streaming: the local engine hands each token over as it is sampled. The vLLM engine's token-in/token-out protocol
has no token stream, so a stream through it carries the finished generation's text in one chunk (then the tool
calls, the finish reason and `[DONE]`, as always): same events, no earlier first byte.

Guarantees: a completion is committed to the event log before its last byte is sent (non-streaming: before the
response; streaming: before the final chunk and `[DONE]`), feedback before its 200; a request refused (bad JSON,
too big, bad key, rate limited, unknown or foreign completion id) gets a 4xx with an OpenAI-style error body and
changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from flywheel.config.online import SIGNALS, ServeConfig
from flywheel.inference.local import LocalEngine
from flywheel.inference.vllm import VLLMError
from flywheel.online.deploy import DeploymentFollower
from flywheel.online.events import CompletionRecord, EventLog, FeedbackRecord, KeyRecord
from flywheel.online.keys import RateLimiter, hash_key
from flywheel.online.protocol import (
    ApiError,
    ChatRequest,
    chunk_body,
    completion_body,
    finish_reason,
    parse_chat_request,
    tool_calls_json,
)
from flywheel.policy.chat import ChatFormat, ParsedTurn
from flywheel.types import Generation

log = logging.getLogger(__name__)


def reply_traits(parsed: ParsedTurn, tools_offered: bool) -> dict[str, Any]:
    """What the hack monitors count: broken tool calls, and a question where a tool call was possible."""
    text = parsed.content.strip()
    return {"num_tool_calls": len(parsed.tool_calls), "num_broken_tool_calls": len(parsed.errors),
            "question": bool(tools_offered and not parsed.tool_calls and text.endswith("?"))}


def trim_stops(text: str, stops: list[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


@dataclass
class ServingState:
    engine: Any  # flywheel.inference.base.Engine; token streaming needs LocalEngine's on_token (vLLM: one chunk)
    tokenizer: Any
    elog: EventLog
    cfg: ServeConfig
    follower: DeploymentFollower | None = None
    pool: Any = None  # online.pool.BackgroundRollouts when simulated rollouts share the engine (its stats())
    learner: Any = None  # online.learner.OnlineLearner when it runs in this process (its status())
    limiter: RateLimiter = field(default_factory=RateLimiter)
    started_s: float = field(default_factory=time.time)
    latencies_ms: list[tuple[float, float, int]] = field(default_factory=list)  # (end time, ms, version)
    _keys: dict[str, tuple[KeyRecord, float]] = field(default_factory=dict)  # key hash -> (record, read at)
    _chats: dict[str, ChatFormat] = field(default_factory=dict)
    tool_format: str = "auto"  # model.tool_format

    def chat_for(self, tools: list[dict]) -> ChatFormat:
        k = json.dumps(tools, sort_keys=True)
        if k not in self._chats:
            if len(self._chats) > 256:
                self._chats.clear()
            self._chats[k] = ChatFormat(self.tokenizer, tools, self.tool_format)
        return self._chats[k]

    async def key(self, request: web.Request) -> KeyRecord:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", "authentication_error")
        h = hash_key(auth[7:].strip())
        cached = self._keys.get(h)
        now = time.monotonic()
        if cached is None or now - cached[1] > self.cfg.key_recheck_s:  # a revocation reaches every host in time
            found = await asyncio.to_thread(self.elog.key_by_hash, h)
            if found is None or found.revoked:
                self._keys.pop(h, None)
                raise ApiError(401, "invalid API key (create one with `flywheel keys add NAME`)",
                               "authentication_error")
            if len(self._keys) > 65_536:
                self._keys.clear()
            cached = self._keys[h] = (found, now)
        rec = cached[0]
        if self.cfg.rate_limit == "shared":
            ok, retry = await asyncio.to_thread(self.elog.take_token, rec.key_id, rec.requests_per_min)
        else:
            ok, retry = self.limiter.allow(rec.key_id, rec.requests_per_min)
        if not ok:
            raise ApiError(429, f"rate limit of {rec.requests_per_min} requests per minute reached for key "
                           f"'{rec.name}'; retry in {retry:.1f} s", "rate_limit_error",
                           headers={"Retry-After": str(max(1, int(retry + 0.999)))})
        return rec

    async def body(self, request: web.Request, rec: KeyRecord) -> Any:
        limit = min(rec.max_body_bytes, self.cfg.max_body_bytes)
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"request body of {request.content_length} bytes exceeds this key's limit of {limit}",
                           "invalid_request_error")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body exceeds the server's limit of {self.cfg.max_body_bytes} bytes") from None
        if len(raw) > limit:
            raise ApiError(413, f"request body of {len(raw)} bytes exceeds this key's limit of {limit}")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ApiError(400, f"the request body is not valid JSON: {err}") from None


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as err:
        return web.json_response(err.body(), status=err.status, headers=err.headers)
    except web.HTTPException as err:
        if err.status >= 400:
            return web.json_response(ApiError(err.status, err.reason, "invalid_request_error").body(),
                                     status=err.status)
        raise


def _state(request: web.Request) -> ServingState:
    return request.app["state"]


async def models(request: web.Request) -> web.Response:
    st = _state(request)
    await st.key(request)
    return web.json_response({"object": "list", "data": [
        {"id": st.cfg.model_name, "object": "model", "created": int(st.started_s), "owned_by": "flywheel",
         "weight_version": st.engine.version}]})


async def status(request: web.Request) -> web.Response:
    st = _state(request)
    await st.key(request)
    installs = [vars(i) for i in st.follower.installs] if st.follower else []
    return web.json_response({"weight_version": st.engine.version, "installs": installs,
                              "follower_error": st.follower.last_error if st.follower else "",
                              "latencies_ms": st.latencies_ms[-10_000:],
                              "pool": st.pool.stats() if st.pool is not None else None,
                              "learner": st.learner.status() if st.learner is not None else None})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "weight_version": _state(request).engine.version})


async def _generate(st: ServingState, req: ChatRequest, prompt: list[int], on_token=None) -> Generation:
    try:
        if on_token is not None and isinstance(st.engine, LocalEngine):
            return await st.engine.generate(prompt, req.sampling, on_token=on_token)
        return await st.engine.generate(prompt, req.sampling)
    except ValueError as err:  # the prompt does not fit the context, and the like
        raise ApiError(400, str(err), param="messages") from None
    except VLLMError as err:  # the vLLM server failed past its restarts: nothing was recorded, the client may retry
        log.error("engine failed: %s", err)
        raise ApiError(503, "the inference engine failed; retry later", "server_error") from None


async def _record(st: ServingState, rec: KeyRecord, cid: str, req: ChatRequest, prompt: list[int], gen: Generation,
                  chat: ChatFormat, t0: float) -> tuple[ParsedTurn, str, int]:
    text = st.tokenizer.decode(gen.token_ids)
    parsed = chat.parse(text)
    # An unusable call (a tool the request did not declare, broken JSON) stays in the reply as the text the
    # model wrote: the client sees what it said, never an empty message
    parsed.content = trim_stops(parsed.shown, req.sampling.stop)
    reason = finish_reason(gen.finish_reason, parsed)
    version = min(gen.versions) if gen.versions else st.engine.version
    meta = {"tools": bool(req.tools), "user": req.user, **reply_traits(parsed, bool(req.tools)),
            "latency_ms": (time.perf_counter() - t0) * 1e3, "stream": req.stream}
    await asyncio.to_thread(st.elog.record_completion, CompletionRecord(
        id=cid, key_id=rec.key_id, model=st.cfg.model_name, version=version, prompt_ids=prompt,
        token_ids=gen.token_ids, logprobs=gen.logprobs, versions=gen.versions, finish_reason=reason, text=text,
        meta=meta))
    st.latencies_ms.append((time.time(), meta["latency_ms"], version))
    return parsed, reason, version


async def chat_completions(request: web.Request) -> web.StreamResponse:
    st = _state(request)
    t0 = time.perf_counter()
    rec = await st.key(request)
    req = parse_chat_request(await st.body(request, rec), st.cfg.model_name, st.cfg.max_tokens,
                             st.cfg.default_max_tokens)
    try:
        chat = st.chat_for(req.tools)
    except (TypeError, ValueError) as err:
        raise ApiError(400, f"tools: {err}", param="tools") from None
    prompt = chat.render(req.messages)
    req.sampling.stop_token_ids = chat.stop_token_ids
    cid = "chatcmpl-" + secrets.token_hex(12)
    if req.stream:
        return await _stream(request, st, rec, req, chat, prompt, cid, t0)
    gen = await _generate(st, req, prompt)
    parsed, reason, version = await _record(st, rec, cid, req, prompt, gen, chat, t0)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids),
             "total_tokens": len(prompt) + len(gen.token_ids)}
    return web.json_response(completion_body(cid, st.cfg.model_name, version, parsed, reason, usage),
                             headers={"X-Flywheel-Weight-Version": str(version)})


async def _stream(request: web.Request, st: ServingState, rec: KeyRecord, req: ChatRequest, chat: ChatFormat,
                  prompt: list[int], cid: str, t0: float) -> web.StreamResponse:
    """Server-sent events: the text as it is sampled (held back where a stop string or a tool call may start),
    then the tool calls, the finish reason and `[DONE]` once the completion is durable."""
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    task = asyncio.ensure_future(_generate(st, req, prompt, on_token=queue.put_nowait))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Flywheel-Completion-Id": cid})
    model, version = st.cfg.model_name, st.engine.version

    async def send(delta: dict[str, Any], reason: str | None = None) -> None:
        await resp.write(b"data: " + json.dumps(chunk_body(cid, model, version, delta, reason)).encode() + b"\n\n")

    try:
        first = await queue.get()  # errors before any token (a prompt too long) are still a plain 4xx
        if first is None:
            task.result()
        await resp.prepare(request)
        await send({"role": "assistant", "content": ""})
        ids: list[int] = [] if first is None else [first]
        emitted, closed = "", first is None
        # the family's markers that are one token each (a tag that is plain text, as SmolLM2's, is seen in the text)
        marker_ids = {i for m, i in chat.marker_ids.items() if m in chat.tool_format.markers}
        stop_ids = set(req.sampling.stop_token_ids)
        hold = max((len(s) for s in req.sampling.stop), default=1) - 1
        while not closed:
            if ids and (ids[-1] in marker_ids or ids[-1] in stop_ids):
                closed = True  # the rest is a tool call or the end marker: sent once parsed
                break
            raw = st.tokenizer.decode(ids)
            text = trim_stops(raw, req.sampling.stop)
            ready, begun = chat.tool_format.content_ready(text)  # the family's call syntax, and a tail that may start it
            if begun:
                closed = True
                break
            if hold and text == raw:  # a stop string's first characters are not content yet either
                ready = ready[:max(0, len(text) - hold)]
            if ready.startswith(emitted) and len(ready) > len(emitted) and not ready.endswith("\ufffd"):
                await send({"content": ready[len(emitted):]})
                emitted = ready
            tok = await queue.get()
            if tok is None:
                break
            ids.append(tok)
        gen = await task
        parsed, reason, version = await _record(st, rec, cid, req, prompt, gen, chat, t0)
        rest = parsed.content[len(emitted):] if parsed.content.startswith(emitted) else ""
        if rest:
            await send({"content": rest})
        if parsed.tool_calls:
            calls = [{"index": i, **c} for i, c in enumerate(tool_calls_json(parsed, cid))]
            await send({"tool_calls": calls})
        await send({}, reason)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        if not task.done():
            task.cancel()


async def feedback(request: web.Request) -> web.Response:
    st = _state(request)
    rec = await st.key(request)
    body = await st.body(request, rec)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object {completion_id, signal, message?, diff?}")
    cid, signal = body.get("completion_id"), body.get("signal")
    if not isinstance(cid, str) or not cid:
        raise ApiError(400, "'completion_id' must be the id of a completion this key received", param="completion_id")
    if signal not in SIGNALS:
        raise ApiError(400, f"'signal' must be one of {list(SIGNALS)}, got {json.dumps(signal)[:40]}", param="signal")
    extra = {k: body.get(k, "") for k in ("message", "diff")}
    for k, v in extra.items():
        if not isinstance(v, str):
            raise ApiError(400, f"'{k}' must be a string", param=k)
    unknown = sorted(set(body) - {"completion_id", "signal", "message", "diff"})
    if unknown:
        raise ApiError(400, f"unknown fields {unknown}; allowed: completion_id, signal, message, diff")
    completion = await asyncio.to_thread(st.elog.completion, cid)
    if completion is None or completion.key_id != rec.key_id:  # a foreign id is reported like an unknown one
        raise ApiError(404, f"no completion '{cid[:80]}' was served to this key", "not_found_error", "completion_id")
    fb = FeedbackRecord(id="fb-" + secrets.token_hex(12), completion_id=cid, key_id=rec.key_id, signal=signal,
                        message=extra["message"], diff=extra["diff"])
    await asyncio.to_thread(st.elog.record_feedback, fb)
    return web.json_response({"id": fb.id, "object": "feedback", "completion_id": cid, "signal": signal,
                              "weight_version": completion.version, "seq": fb.seq})


def build_app(state: ServingState) -> web.Application:
    app = web.Application(client_max_size=state.cfg.max_body_bytes, middlewares=[_errors])
    app["state"] = state
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/flywheel/status", status)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/feedback", feedback)
    return app
