"""The local inference engine: many concurrent asyncio sessions, one decode thread, continuous batching.

    async with LocalEngine(model, tokenizer=tok) as engine:        # or: await engine.start() ... stop()
        gen = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=128))
    engine.update_weights(version, state_dict_tensors)               # from any thread; returns pause_ms

Why a thread: torch forward calls block, so a dedicated decode thread owns the model and batches the
requests; the event loop stays free for the agent sessions and results come back through futures
resolved with `loop.call_soon_threadsafe`. Between decode steps new requests are prefilled (within a
`max_prefill_tokens` budget) and join the running batch; finished ones leave. Users' requests are admitted
before background ones (simulated rollouts sharing a serving engine), which never hold more than
`max_background_rows` of the batch nor, beside users, prefill more than `max_background_prefill_tokens` in a step
(inference/scheduler.py). The model runs through a Runner (modeling/runner.py): the native decoder for every
family of the registry (modeling/decoder.py: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE; no padding, KV caches in
one pool, one attention call per layer for the whole batch), else the HF forward one sequence at a time. A prefix
kept for reuse is copied out of the pool (`runner.detach`) so that the pool holds only running requests.

Prompt prefixes already computed (a session's earlier turns, a group's shared prompt) are reused instead of
prefilled again (`inference/prefix_cache.py`, `prefix_cache_mb`; not in batch-invariant mode).

Weight swaps: `update_weights` validates every name/shape/dtype and copies the tensors *before* taking the
step lock, then swaps parameter `.data` pointers under it (microseconds). A LoRA run's versions come through
`update_adapter`: merged into the pristine base off the lock (inference/lora.py), swapped the same way. Every
token records the version whose weights ran the forward that produced it. Stop strings need a tokenizer; the token that completes
a stop string or is a stop token is kept in the output (token-exact trajectories keep what was sampled).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from flywheel.inference.lora import AdapterMerger
from flywheel.inference.prefix_cache import PrefixStore
from flywheel.inference.sampling import sample_token
from flywheel.inference.scheduler import PRIORITIES, AdmissionQueue, Priority
from flywheel.modeling import openmp
from flywheel.modeling.quant import from_served_tensors, quantize_params_, quantize_weight
from flywheel.modeling.runner import runner_for
from flywheel.types import Generation, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator
    limit: int  # tokens this request may generate (max_new_tokens clamped to the context)
    stop_ids: frozenset[int]
    t_submit: float
    cache: Any = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routed: list[list[list[int]]] = field(default_factory=list)
    ttft_s: float = 0.0
    finish_reason: Literal["stop", "length", "aborted"] | None = None
    on_token: Callable[[int], None] | None = None  # called on the caller's loop with each sampled token id
    kv_version: int = -1  # the weight version that wrote all of `cache`; -1 once versions are mixed
    num_reused: int = 0  # prompt positions taken from a known prefix instead of prefilled
    priority: Priority = "user"  # admission order (inference/scheduler.py); never changes the numbers

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()


def _resolve(future: asyncio.Future, value: Any) -> None:
    if future.done():  # cancelled by the caller meanwhile
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


class LocalEngine:
    """Implements flywheel.inference.base.Engine on a local torch model (CPU or one GPU)."""

    def __init__(self, model, *, max_batch_size: int = 64, max_seq_len: int | None = None,
                 tokenizer=None, version: int = 0, max_prefill_tokens: int = 4096, batch_invariant: bool = False,
                 prefix_cache_mb: int = 0, max_background_rows: int | None = None,
                 max_background_prefill_tokens: int | None = None, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16", update_dtype: torch.dtype | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_seq_len = int(max_seq_len or model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.runner = runner_for(model, self.max_seq_len, bool(batch_invariant), kv_dtype=kv_dtype)
        self.batch_invariant = bool(batch_invariant)
        self.is_moe = bool(self.runner.is_moe)
        # Prompt prefixes already computed are reused (inference/prefix_cache.py): a runner that can continue a
        # cache, not in batch-invariant mode (a prefill over a reused prefix reduces in another order than the trainer).
        self.prefix_cache = (PrefixStore(prefix_cache_mb << 20)
                             if prefix_cache_mb > 0 and self.runner.reuses_prefixes and not self.batch_invariant
                             else None)
        eos = getattr(model.config, "eos_token_id", None)
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._version = int(version)
        self._params = dict(model.state_dict(keep_vars=True))  # name -> Parameter/buffer (tied names alias)
        # the dtype weight updates arrive in (the trainer's model.dtype): a bf16 engine of a float32 policy
        # (inference.dtype) takes float32 updates and rounds them to its own dtype; None = each tensor's own dtype
        self.update_dtype = update_dtype
        self.weight_dtype = weight_dtype  # inference.weight_dtype: served weights fake-quantized (modeling/quant.py)
        quantize_params_(self._params, weight_dtype)
        # LoRA runs: adapters merged into the pristine base, or hung unmerged on the native runner's linears
        self._adapter = AdapterMerger(self._params, dict(model.named_modules()),
                                      unmerged_ok=self.runner.adds_lora_factors)
        self._step_lock = threading.Lock()  # held for each prefill/decode step and for a weight swap
        # weight swaps waiting for the step lock: the decode thread lets them in before its next step (a lock is
        # not fair; with steps back to back a swap could otherwise wait for the whole batch to finish)
        self._swaps_waiting = 0
        self._cond = threading.Condition()  # guards _pending/_paused/_stopping, wakes the decode thread
        # users first, background (simulated rollouts) on what is left, within max_background_rows
        self._pending: AdmissionQueue[_Request] = AdmissionQueue(max_batch_size, max_background_rows,
                                                                 max_prefill_tokens, max_background_prefill_tokens)
        self.max_background_rows = self._pending.max_background_rows
        self.peak_background_rows = 0  # most background rows ever in one step (<= max_background_rows)
        self._running: list[_Request] = []
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        # step log for benchmarks: (t_start_s, t_end_s, version, num_decode_rows, num_prefills); bounded
        # Read it from other threads only as a copy (`list(engine.step_log)`: one C call under the GIL); a
        # Python-level iteration races the decode thread's appends ("deque mutated during iteration").
        self.step_log: deque[tuple[float, float, int, int, int]] = deque(maxlen=100_000)
        self.busy_s = 0.0  # seconds spent in steps since the engine was built (a float: safe to read anywhere)
        # the thread that built the engine (and loaded the model) gives its OpenMP workers back, so that the decode
        # thread's team is the process's only one (modeling/openmp.py); the same after a weight update and when the
        # decode thread goes idle
        openmp.release_team()

    # ---- lifecycle ---------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        self._ensure_thread()

    async def stop(self) -> None:
        """Stop the decode thread; requests still queued or running finish with reason 'aborted'."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        with self._cond:
            leftover = self._pending.drain() + self._running
            self._running = []
            self._stopping = False
        for r in leftover:
            r.finish_reason = "aborted"
            r.loop.call_soon_threadsafe(_resolve, r.future, self._generation(r))

    async def __aenter__(self) -> LocalEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def _ensure_thread(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flywheel-decode", daemon=True)
                self._thread.start()

    def pause(self) -> None:
        """No step starts after this returns (waits for a step in progress); requests stay queued."""
        with self._cond:
            self._paused = True
        with self._step_lock:
            pass

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # ---- requests ----------------------------------------------------------------------------------

    def _validate(self, prompt_ids: list[int], sp: SamplingParams) -> None:
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sp).__name__}")
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; give at least one token")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_ids):
            bad = next(t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < self.vocab_size))
            raise ValueError(f"prompt token {bad!r} is not an int in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_seq_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_seq_len} "
                             f"tokens (it needs room for at least one generated token); shorten the prompt")
        if not sp.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {sp.temperature}")
        if not 0 < sp.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {sp.top_p}")
        if sp.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sp.max_new_tokens}")
        if sp.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass tokenizer= to LocalEngine or use stop_token_ids")

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: Callable[[int], None] | None = None, priority: Priority = "user") -> Generation:
        """`on_token(token_id)` (optional) runs on the caller's event loop as each token is sampled: streaming
        (online/server.py). The Generation returned at the end is the record; the callbacks only preview it.
        `priority`: "user" requests are admitted before "background" ones (simulated rollouts on a serving engine,
        online/pool.py), which hold at most `max_background_rows` of the batch; the tokens do not depend on it."""
        prompt_ids = list(prompt_ids)
        self._validate(prompt_ids, sampling)
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {list(PRIORITIES)}, got {priority!r}")
        loop = asyncio.get_running_loop()
        gen = torch.Generator(device="cpu")
        gen.manual_seed(sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        req = _Request(prompt_ids=prompt_ids, params=sampling, loop=loop, future=loop.create_future(),
                       generator=gen, limit=min(sampling.max_new_tokens, self.max_seq_len - len(prompt_ids)),
                       stop_ids=frozenset(sampling.stop_token_ids) | self.eos_ids, t_submit=time.perf_counter(),
                       on_token=on_token, priority=priority)
        self._ensure_thread()
        with self._cond:
            self._pending.push(req)
            self._cond.notify_all()
        return await req.future

    # ---- weights -----------------------------------------------------------------------------------

    def update_weights(self, version: int, tensors: Mapping[str, Any], *, served_format: str | None = None) -> float:
        """Install `tensors` (state-dict names; a subset is fine) as `version`. Returns the pause in ms.

        `served_format`: the tensors are already as an engine in that format serves them (weights.publish_served),
        so they are installed as given, not rounded or quantized again; it must be this engine's weight_dtype, and
        the tensors this engine's dtype. Everything is validated and copied before decoding is held; a rejected
        update raises ValueError (or TypeError) naming the tensor and leaves the engine serving its previous
        version."""
        if not isinstance(tensors, Mapping) or not tensors:
            raise ValueError("update_weights needs a non-empty mapping of state-dict name -> tensor")
        if served_format is not None:
            if served_format != self.weight_dtype:
                raise ValueError(f"weight update in the served form of {served_format}; this engine serves "
                                 f"{self.weight_dtype}: set inference.weight_dtype = '{served_format}' on every "
                                 "engine of this store, or weights.publish_served = false on the trainer")
            tensors = from_served_tensors(tensors, served_format, self._params)
        prepared = []
        for name, t in tensors.items():
            if name not in self._params:
                near = [n for n in self._params if n.split(".")[-2:] == str(name).split(".")[-2:]][:3]
                raise ValueError(f"weight update: unknown tensor '{name}' (not in the model's state dict"
                                 + (f"; did you mean {near}?)" if near else ")"))
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"weight update: '{name}' is a {type(t).__name__}, expected a torch.Tensor")
            cur = self._params[name]
            if tuple(t.shape) != tuple(cur.shape):
                raise ValueError(f"weight update: '{name}' has shape {tuple(t.shape)}, the model expects "
                                 f"{tuple(cur.shape)}")
            expect = (self.update_dtype if self.update_dtype is not None and cur.is_floating_point()
                      and served_format is None else cur.dtype)
            if t.dtype != expect:
                raise ValueError(f"weight update: '{name}' has dtype {t.dtype}, the model expects {expect}")
            new = t.detach().to(device=cur.device, dtype=cur.dtype, copy=True).contiguous()
            prepared.append((cur, new if served_format is not None else quantize_weight(name, new, self.weight_dtype)))
        self._adapter.reset_base([str(n) for n in tensors])  # full weights: the new base of any later adapter
        with self._cond:
            self._swaps_waiting += 1
        try:
            with self._step_lock:
                t0 = time.perf_counter()
                for cur, new in prepared:
                    cur.data = new
                self._version = int(version)
                pause_ms = (time.perf_counter() - t0) * 1000.0
        finally:
            with self._cond:
                self._swaps_waiting -= 1
                self._cond.notify_all()
            openmp.release_team()  # the copies above ran parallel ops on the caller's thread
        return pause_ms

    def served_weights(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The values this engine computes with under state-dict `names` (its own storage: do not write into them),
        for a subscriber's check that a served-form update was installed as published."""
        return {n: self._params[n].detach() for n in names if n in self._params}

    def update_adapter(self, version: int, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> float:
        """Serve a LoRA adapter (`<module>.lora_A` / `.lora_B`, meta with `scale` and `base_digest`) as `version`,
        merged into the pristine base weights, or beside them with `meta["serve"] = "unmerged"` (inference/lora.py).
        Returns the pause in ms; a rejected adapter raises ValueError and leaves the engine serving its previous
        version."""
        swaps, kept = self._adapter.prepare(tensors, meta)  # validated and merged before decoding is held
        with self._cond:
            self._swaps_waiting += 1
        try:
            with self._step_lock:
                t0 = time.perf_counter()
                self._adapter.commit(swaps, kept, float(meta["scale"]), unmerged=meta.get("serve") == "unmerged")
                self._version = int(version)
                pause_ms = (time.perf_counter() - t0) * 1000.0
        finally:
            with self._cond:
                self._swaps_waiting -= 1
                self._cond.notify_all()
            openmp.release_team()  # the copies above ran parallel ops on the caller's thread
        return pause_ms

    def served_adapter(self) -> dict[str, torch.Tensor]:
        """The adapter tensors merged into the weights now ({} without one): the subscriber checks their hashes
        against the trainer's manifest (weights/sync.py)."""
        return dict(self._adapter.served)

    # ---- the decode thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._swaps_waiting or self._paused
                                              or (not self._pending and not self._running)):
                    self._cond.wait()
                if self._stopping:
                    return
                admitted = self._pending.admit(self._running)
            try:
                with self._step_lock:
                    t0 = time.perf_counter()
                    version = self._version
                    for r in admitted:
                        self._prefill(r, version)
                    decoding = [r for r in self._running if r.finish_reason is None and not r.future.cancelled()]
                    if decoding:
                        self._decode(decoding, version)
                        num_bg = sum(r.priority == "background" for r in decoding)
                        self.peak_background_rows = max(self.peak_background_rows, num_bg)
                    t1 = time.perf_counter()
                    self.step_log.append((t0, t1, version, len(decoding), len(admitted)))
                    self.busy_s += t1 - t0
            except Exception as exc:  # a failed step fails its requests, never the engine
                failed = admitted + self._running
                self._running = []
                for r in failed:
                    r.loop.call_soon_threadsafe(_resolve, r.future, exc)
                continue
            self._retire()
            if not self._running:  # the decode thread's own list: the lock only when nothing runs
                with self._cond:
                    idle = not self._pending
                if idle:  # hold no OpenMP workers until the next request
                    openmp.release_team()

    def _prefill(self, r: _Request, version: int) -> None:
        r.cache = self.runner.new_cache(len(r.prompt_ids) + r.limit)
        if self.prefix_cache is not None:
            live = [(self._fed(o), o.cache, o.kv_version) for o in self._running
                    if o.cache is not None and o.kv_version == version]  # others can never be reused
            src, n = self.prefix_cache.lookup(r.prompt_ids, version, live)
            if n:
                r.cache.k[:, :, :n] = src.k[:, :, :n]
                r.cache.v[:, :, :n] = src.v[:, :, :n]
                r.cache.length = r.num_reused = n
        logits, routed = self.runner.prefill(r.prompt_ids, r.cache, start=r.num_reused)
        r.kv_version = version
        self._append(r, logits, None if routed is None else routed.tolist(), version)
        r.ttft_s = time.perf_counter() - r.t_submit
        self._running.append(r)

    def _decode(self, rows: list[_Request], version: int) -> None:
        logits, routed = self.runner.decode([r.token_ids[-1] for r in rows], [r.cache for r in rows])
        routed_l = None if routed is None else routed.tolist()
        for i, r in enumerate(rows):
            if r.kv_version != version:
                r.kv_version = -1
            self._append(r, logits[i], None if routed_l is None else routed_l[i], version)

    def _append(self, r: _Request, logits: torch.Tensor, routed, version: int) -> None:
        sp = r.params
        token, lp = sample_token(logits, sp.temperature, sp.top_p, r.generator)
        r.token_ids.append(token)
        r.logprobs.append(lp)
        r.versions.append(version)
        if r.on_token is not None:
            r.loop.call_soon_threadsafe(r.on_token, token)
        if routed is not None:
            r.routed.append(routed)
        if token in r.stop_ids or (sp.stop and self._hit_stop_string(r)):
            r.finish_reason = "stop"
        elif len(r.token_ids) >= r.limit:
            r.finish_reason = "length"

    def _hit_stop_string(self, r: _Request) -> bool:
        window = max(16, 4 * max(len(s) for s in r.params.stop))
        text = self.tokenizer.decode(r.token_ids[-window:])
        tail = len(self.tokenizer.decode(r.token_ids[-1:])) + max(len(s) for s in r.params.stop)
        return any(s in text[-tail:] for s in r.params.stop)

    def _retire(self) -> None:
        keep = []
        for r in self._running:
            if r.future.cancelled():
                continue
            if r.finish_reason is None:
                keep.append(r)
                continue
            if self.prefix_cache is not None and r.kv_version >= 0:  # kept for a later turn or group member
                try:  # a standalone copy: the store must not hold pool slots (modeling/decoder.py `detach`)
                    self.prefix_cache.add(self._fed(r), self.runner.detach(r.cache), r.kv_version)
                except Exception:  # noqa: BLE001 - a prefix not kept costs a prefill; a raise here would lose requests
                    log.exception("prefix cache: could not keep a finished request's cache")
            r.cache = None  # free the KV cache now (or leave it to the prefix store)
            r.loop.call_soon_threadsafe(_resolve, r.future, self._generation(r))
        self._running = keep

    @staticmethod
    def _fed(r: _Request) -> list[int]:
        """The tokens whose keys and values `r.cache` holds (the last sampled token was never fed)."""
        return (r.prompt_ids + r.token_ids)[:r.cache.length]

    def _generation(self, r: _Request) -> Generation:
        return Generation(token_ids=list(r.token_ids), logprobs=list(r.logprobs), versions=list(r.versions),
                          routed_experts=list(r.routed) if self.is_moe else None,
                          finish_reason=r.finish_reason or "aborted", prompt_len=len(r.prompt_ids),
                          ttft_s=r.ttft_s)


def build_engine(cfg, model, tokenizer=None, batch_invariant: bool = False,
                 max_background_rows: int | None = None,
                 max_background_prefill_tokens: int | None = None,
                 update_dtype: torch.dtype | None = None) -> LocalEngine:
    """An engine from an InferenceConfig. `batch_invariant` is `numerics.batch_invariant` (log-probs
    bit-identical to the trainer's); `max_background_rows` and
    `max_background_prefill_tokens` are `online.pool`'s (None: no cap); `update_dtype` is the dtype the
    trainer publishes, when the engine serves in another (`inference.dtype`)."""
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)  # explicit user request; process-wide in torch
    return LocalEngine(model, max_batch_size=cfg.max_batch_size, max_prefill_tokens=cfg.max_prefill_tokens,
                       tokenizer=tokenizer, batch_invariant=batch_invariant, prefix_cache_mb=cfg.prefix_cache_mb,
                       max_background_rows=max_background_rows,
                       max_background_prefill_tokens=max_background_prefill_tokens,
                       weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype, update_dtype=update_dtype)
