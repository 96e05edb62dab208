"""Publisher (trainer side) and Subscriber (engine side) of the weight store.

    pub = Publisher(WeightStore("runs/x/weights"), anchor_every=10, dtype="bfloat16")
    fut = pub.publish(step, model.state_dict())      # returns at once; params may change right after
    fut.result()["bytes_published"]; pub.close()

    sub = Subscriber("http://relay:8470", engine)     # or a WeightStore / directory
    sub.poll()                                        # fetch + verify + apply the newest version, or None
    sub.start(); ...; sub.stop()                      # or poll in a background thread

Why so. `publish` only snapshots the tensors (a copy, cast to the served dtype) on the caller's
thread; encoding, chunk writes, the manifest and garbage collection run on one background thread
(in order) with a pool for the chunks, so the trainer's step is not held by compression or I/O.
Each version carries a delta against the previously published one, and every `anchor_every`
versions also a full anchor; a subscriber at u compares the bytes of the delta chain u -> v with
those of the newest anchor plus its chain, fetches the cheaper one with `streams` parallel
requests, checks every chunk against its content hash (re-fetching a bad one `max_retries` times),
decodes into new arrays, checks every tensor's sha256 against the manifest, and only then hands
the tensors to `engine.update_weights`. Any failure on the delta path falls back to the anchor path;
if that fails too the subscriber keeps serving its last good version and reports the error.

The served form (`served_format`, `to_served`; weights.publish_served): the publisher stores what a low-precision
engine takes instead of the trainer's tensor (a quantized weight's codes and scales), with the sha256 of the values
that engine will then serve; the subscriber installs it with `update_weights(..., served_format=)` and checks
`engine.served_weights` against those hashes, as it checks a LoRA adapter's (IntegrityError on a mismatch).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from flywheel.weights.codec import CodecError, chunk_num_changed
from flywheel.weights.relay import HttpStore
from flywheel.weights.store import MANIFEST_FORMAT, StoreError, WeightStore, chunk_id
from flywheel.weights.tensors import (
    DTYPES,
    bits_hash,
    decode_tensor,
    dtype_name,
    encode_tensor,
    from_bits,
    manifest_hash,
    tensor_hash,
    to_bits,
)

log = logging.getLogger(__name__)


class IntegrityError(ValueError):
    """Fetched bytes do not match their hash: the weights are refused."""


def _threads(n: int) -> int:
    return n if n > 0 else max(1, os.cpu_count() or 1)


def open_source(source: Any):
    """A readable store: a WeightStore/HttpStore as is, an http(s) URL as HttpStore, else a WeightStore."""
    if isinstance(source, str):
        if source.startswith(("http://", "https://")):
            return HttpStore(source)
        return WeightStore(source)
    for attr in ("list_versions", "read_manifest", "get_chunk"):
        if not hasattr(source, attr):
            raise TypeError(f"weight source {source!r} lacks .{attr}(); pass a WeightStore, HttpStore or URL")
    return source


class Publisher:
    """Encodes and writes versions off the caller's thread; `publish` returns a Future of the metrics."""

    def __init__(self, store: WeightStore | str, anchor_every: int = 10, *, chunk_mb: float = 4.0,
                 zstd_level: int = 3, num_threads: int = 0, keep_versions: int | None = None,
                 dtype: str | None = None, max_pending: int = 2, gc_min_age_s: float = 60.0,
                 on_metrics: Callable[[dict], None] | None = None, served_format: str = "",
                 to_served: Callable[[str, torch.Tensor], tuple[Mapping[str, torch.Tensor], torch.Tensor]] | None = None):
        if bool(served_format) != (to_served is not None):
            raise ValueError("served_format and to_served go together: the format's name and the function that "
                             "gives, for one state-dict tensor, the store tensors an engine in that format takes "
                             "and the values it then serves")
        if anchor_every < 1:
            raise ValueError(f"anchor_every must be >= 1, got {anchor_every}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.store = store if isinstance(store, WeightStore) else WeightStore(store)
        self.anchor_every = anchor_every
        self.chunk_bytes = max(1, int(chunk_mb * (1 << 20)))
        self.zstd_level = zstd_level
        self.keep_versions = keep_versions
        if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"publisher dtype '{dtype}' is not a torch dtype name such as 'bfloat16'")
        self.dtype = dtype
        self.gc_min_age_s = gc_min_age_s
        self.on_metrics = on_metrics
        # the served form (weights.publish_served): each tensor as a `served_format` engine holds it (a quantized
        # weight: the format's codes and scales), made on the background thread before hashing, so the delta is
        # computed on what engines serve and they verify exactly that
        self.served_format, self.to_served = served_format, to_served
        self.metrics: list[dict] = []
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="weights-publish")
        self._pool = ThreadPoolExecutor(_threads(num_threads), thread_name_prefix="weights-encode")
        # chunk writes wait on the disk (each is fsynced), not on a CPU: more in flight than cores, so the
        # file system commits them together (50 small fsynced files: ~150 ms one by one, ~30 ms 8 at a time)
        self._io = ThreadPoolExecutor(max(8, _threads(num_threads)), thread_name_prefix="weights-write")
        self._slots = threading.Semaphore(max_pending)
        self._pending: list[Future] = []
        self._last_requested: int | None = None
        self._prev: dict[str, tuple[np.ndarray, str, tuple[int, ...]]] | None = None
        self._prev_version: int | None = None
        self._last_anchor: int | None = None
        existing = self.store.latest_version()
        if existing is not None:
            self._last_requested = existing

    @classmethod
    def from_config(cls, store: WeightStore | str, cfg: Any, **kwargs: Any) -> Publisher:
        """Build from a `WeightsConfig`."""
        return cls(store, cfg.anchor_every, chunk_mb=cfg.chunk_mb, zstd_level=cfg.zstd_level,
                   num_threads=cfg.num_threads, keep_versions=cfg.keep_versions, **kwargs)

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor],
                adapter: Mapping[str, Any] | None = None) -> Future:
        """Snapshot `state_dict` now and publish it as `version` in the background. `adapter`: the tensors are a
        LoRA adapter, not the model (`Trainer.publish_meta()`: rank, scale, the digest of the base weights); the
        manifest carries it and subscribers install the version with `engine.update_adapter`."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if self._last_requested is not None and version <= self._last_requested:
            raise ValueError(f"version {version} is not newer than {self._last_requested}; versions must increase")
        if not state_dict:
            raise ValueError("state_dict is empty; nothing to publish")
        t0 = time.perf_counter()
        snap: dict[str, tuple[np.ndarray, str, tuple[int, ...]]] = {}
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"state_dict['{name}'] is {type(t).__name__}, not a torch.Tensor")
            dt = getattr(torch, self.dtype) if self.dtype and t.is_floating_point() else t.dtype
            copy = t.detach().to(device="cpu", dtype=dt, copy=True).contiguous()
            snap[name] = (to_bits(copy), dtype_name(dt), tuple(copy.shape))
        snapshot_ms = (time.perf_counter() - t0) * 1e3
        self._last_requested = version
        self._slots.acquire()
        fut = self._worker.submit(self._publish, version, snap, snapshot_ms, dict(adapter) if adapter else None)
        fut.add_done_callback(lambda _: self._slots.release())
        self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def _publish(self, version: int, snap: dict, snapshot_ms: float, adapter: dict | None = None) -> dict:
        t0 = time.perf_counter()
        served_hashes: dict[str, str] = {}
        if self.to_served is not None and adapter is None:
            served: dict = {}
            with torch.no_grad():
                for name, (bits, dt, shape) in snap.items():
                    stored, values = self.to_served(name, from_bits(bits, dt, shape))
                    for key, t in stored.items():
                        served[key] = (to_bits(t.contiguous()), dtype_name(t.dtype), tuple(t.shape))
                    served_hashes[name] = bits_hash(to_bits(values))
            snap = served
        prev = self._prev or {}
        compatible = self._prev is not None and set(prev) == set(snap) and all(
            prev[k][1:] == snap[k][1:] for k in snap)
        anchor = (not compatible or self._last_anchor is None
                  or version - self._last_anchor >= self.anchor_every)
        tensors: dict[str, dict] = {}
        blobs: list[bytes] = []
        raw_bytes = delta_bytes = full_bytes = num_changed = 0
        for name, (bits, dt, shape) in snap.items():
            chunk_elems = max(1, self.chunk_bytes // bits.dtype.itemsize)
            entry: dict[str, Any] = {"dtype": dt, "shape": list(shape), "hash": tensor_hash(bits, chunk_elems),
                                     "chunk_elems": chunk_elems, "full": None, "delta": None}
            raw_bytes += bits.nbytes
            if anchor:
                parts = encode_tensor(bits, None, self.chunk_bytes, self.zstd_level, self._pool)
                entry["full"] = [[chunk_id(b), len(b)] for b in parts]
                full_bytes += sum(len(b) for b in parts)
                blobs += parts
            if compatible:
                parts = encode_tensor(bits, prev[name][0], self.chunk_bytes, self.zstd_level, self._pool)
                entry["delta"] = [[chunk_id(b), len(b)] for b in parts]
                delta_bytes += sum(len(b) for b in parts)
                num_changed += sum(chunk_num_changed(b) for b in parts)
                blobs += parts
            tensors[name] = entry
        encode_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        list(self._io.map(self.store.put_chunk, blobs))
        manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "version": version, "anchor": anchor,
                                    "base": self._prev_version if compatible else None, "created_s": time.time(),
                                    "raw_bytes": raw_bytes, "full_bytes": full_bytes, "delta_bytes": delta_bytes,
                                    "tensors": tensors}
        if adapter is not None:
            manifest["adapter"] = adapter
        elif self.served_format:  # and the sha256 of the values an engine then serves, per state-dict name
            manifest["served_format"], manifest["served"] = self.served_format, served_hashes
        self.store.write_manifest(manifest)
        write_ms = (time.perf_counter() - t1) * 1e3
        self._prev, self._prev_version = snap, version
        if anchor:
            self._last_anchor = version
        gc = self.store.gc(self.keep_versions, self.gc_min_age_s) if self.keep_versions else None
        published = delta_bytes + full_bytes
        num_elements = sum(b.shape[0] for b, _, _ in snap.values())
        m = {"version": version, "anchor": anchor, "base": manifest["base"], "bytes_published": published,
             "adapter": adapter is not None,
             "raw_bytes": raw_bytes, "ratio": published / max(raw_bytes, 1),
             "delta_ratio": delta_bytes / max(raw_bytes, 1) if compatible else None,
             "changed_fraction": num_changed / max(num_elements, 1) if compatible else None,
             "snapshot_ms": snapshot_ms, "encode_ms": encode_ms, "write_ms": write_ms, "gc": gc}
        self.metrics.append(m)
        if self.on_metrics:
            self.on_metrics(m)
        return m

    def flush(self) -> None:
        """Wait for every pending publish (re-raising the first failure)."""
        for f in list(self._pending):
            f.result()
        self._pending = []

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._worker.shutdown(wait=True)
            self._pool.shutdown(wait=True)
            self._io.shutdown(wait=True)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Subscriber:
    """Pulls the newest version, verifies it bit for bit, and installs it in `engine`."""

    def __init__(self, source: Any, engine: Any = None, *, streams: int = 8, num_threads: int = 0,
                 poll_interval_s: float = 0.5, max_retries: int = 1,
                 on_metrics: Callable[[dict], None] | None = None):
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        self.source = open_source(source)
        self.engine = engine
        self.max_retries = max_retries
        self.poll_interval_s = poll_interval_s
        self.on_metrics = on_metrics
        self.version: int | None = None
        self.metrics: list[dict] = []
        self.last_error: Exception | None = None
        self._bits: dict[str, tuple[np.ndarray, str, tuple[int, ...]]] = {}
        self._manifests: dict[int, dict] = {}
        self._fetch = ThreadPoolExecutor(streams, thread_name_prefix="weights-fetch")
        self._decode = ThreadPoolExecutor(_threads(num_threads), thread_name_prefix="weights-decode")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, source: Any, engine: Any, cfg: Any, **kwargs: Any) -> Subscriber:
        return cls(source, engine, streams=cfg.relay_streams, num_threads=cfg.num_threads, **kwargs)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The last verified version's tensors (shares memory; do not write into them)."""
        return {k: from_bits(b, dt, shape) for k, (b, dt, shape) in self._bits.items()}

    def _manifest(self, v: int) -> dict:
        if v not in self._manifests:
            self._manifests[v] = self.source.read_manifest(v)
        return self._manifests[v]

    def _plans(self, v: int) -> list[tuple[int, str, list[tuple[dict, str]]]]:
        """(bytes, kind, steps) for the delta chain from self.version and the anchor route to v (only the anchor
        route when v is older than self.version: a rollback)."""
        plans = []
        if self.version is not None and v < self.version:
            return self._plans_from_scratch(v)
        steps: list[dict] = []
        cur: int | None = v
        anchor_found = False
        while cur is not None and len(steps) < 100_000:
            if self.version is not None and cur <= self.version:
                if cur == self.version:
                    plan = [(m, "delta") for m in reversed(steps)]
                    plans.append((sum(_cost(m, "delta") for m in steps), "delta", plan))
                break
            try:
                m = self._manifest(cur)
            except StoreError:
                break
            if m["anchor"] and not anchor_found:
                anchor_found = True
                plan = [(m, "full")] + [(x, "delta") for x in reversed(steps)]
                plans.append((_cost(m, "full") + sum(_cost(x, "delta") for x in steps), "anchor", plan))
                if self.version is None:
                    break
            steps.append(m)
            cur = m.get("base")
        plans.sort(key=lambda p: p[0])
        return plans

    def _plans_from_scratch(self, v: int) -> list[tuple[int, str, list[tuple[dict, str]]]]:
        held, self.version = self.version, None
        try:
            return self._plans(v)
        finally:
            self.version = held

    def _get(self, cid: str) -> tuple[bytes, int]:
        err: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                data = self.source.get_chunk(cid)
            except (StoreError, OSError) as e:
                err = e
                continue
            if chunk_id(data) == cid:
                return data, attempt
            err = IntegrityError(f"chunk {cid[:12]}… failed its hash check ({len(data)} bytes)")
        raise err if isinstance(err, IntegrityError) else StoreError(f"chunk {cid[:12]}… could not be fetched: {err}")

    def _execute(self, steps: list[tuple[dict, str]]) -> tuple[dict, dict]:
        t0 = time.perf_counter()
        ids = list(dict.fromkeys(cid for m, key in steps for t in m["tensors"].values() for cid, _ in t[key] or []))
        got = dict(zip(ids, self._fetch.map(self._get, ids)))
        fetch_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        state = dict(self._bits)
        for m, key in steps:
            if key == "delta" and set(m["tensors"]) != set(state):
                raise ValueError(f"version {m['version']} names other tensors than its base; cannot apply its delta")
            new = {}
            for name, t in m["tensors"].items():
                shape, dt = tuple(t["shape"]), t["dtype"]
                size = _itemsize(dt)
                n = int(np.prod(shape, dtype=np.int64))
                if key == "delta":
                    if t["delta"] is None:
                        raise ValueError(f"version {m['version']} has no delta for '{name}'")
                    base = state[name]
                    if base[1] != dt or base[2] != shape:
                        raise ValueError(f"delta of '{name}' is {dt}{shape}, base is {base[1]}{base[2]}")
                    old = base[0]
                else:
                    old = None
                blobs = [got[cid][0] for cid, _ in t[key]]
                new[name] = (decode_tensor(blobs, old, n, size, t["chunk_elems"], self._decode), dt, shape)
            state = new
        final = steps[-1][0]
        fmt = final["format"]
        hashes = self._decode.map(lambda item: manifest_hash(item[1][0], final["tensors"][item[0]], fmt), state.items())
        bad = [name for name, h in zip(state, hashes) if h != final["tensors"][name]["hash"]]
        if bad:
            raise IntegrityError(f"version {final['version']}: {len(bad)} tensors fail their sha256 ({bad[:3]})")
        stats = {"fetch_ms": fetch_ms, "apply_ms": (time.perf_counter() - t1) * 1e3,
                 "bytes_fetched": sum(len(d) for d, _ in got.values()),
                 "num_retries": sum(r for _, r in got.values())}
        return state, stats

    def poll(self, target: int | None = None) -> int | None:
        """Fetch, verify and install the newest version; returns it, or None if nothing new was installed.

        `target`: install that version instead, older ones included (a deploy or a rollback chosen elsewhere:
        online/deploy.py); None when it is already installed or not in the store."""
        with self._lock:
            try:
                versions = self.source.list_versions()
            except (StoreError, OSError) as err:
                self.last_error = err
                return None
            if target is not None:
                if target not in versions or target == self.version:
                    if target not in versions:
                        self.last_error = StoreError(f"version {target} is not in the store")
                    return None
                versions = [target]
            if not versions or (target is None and self.version is not None and versions[-1] <= self.version):
                return None
            v = versions[-1]
            t0 = time.perf_counter()
            try:
                plans = self._plans(v)
            except (StoreError, OSError, ValueError) as err:
                plans, self.last_error = [], err
            errors = []
            for i, (cost, kind, steps) in enumerate(plans):
                try:
                    state, stats = self._execute(steps)
                except (StoreError, OSError, CodecError, ValueError, KeyError, TypeError) as err:
                    errors.append(f"{kind}: {err}")
                    log.warning("weights v%s via %s failed: %s", v, kind, err)
                    continue
                tensors = {k: from_bits(b, dt, shape) for k, (b, dt, shape) in state.items()}
                pause_ms = 0.0
                final = steps[-1][0]
                adapter = final.get("adapter")
                if self.engine is not None:
                    try:
                        if adapter is not None:
                            pause_ms = self._install_adapter(v, tensors, final)
                        elif final.get("served_format"):
                            pause_ms = self._install_served(v, tensors, final)
                        else:
                            pause_ms = float(self.engine.update_weights(v, tensors) or 0.0)
                    except ValueError as err:
                        self.last_error = err
                        log.warning("engine refused weights v%s: %s", v, err)
                        if isinstance(err, IntegrityError):
                            raise
                        return None
                m = {"version": v, "from_version": self.version, "path": kind, "fallback": i > 0,
                     "num_steps": len(steps), "planned_bytes": cost, **stats, "pause_ms": pause_ms,
                     "total_ms": (time.perf_counter() - t0) * 1e3, "errors": errors}
                self._bits, self.version, self.last_error = state, v, None
                self.metrics.append(m)
                if self.on_metrics:
                    self.on_metrics(m)
                return v
            self.last_error = StoreError(f"could not install weights v{v}: " + ("; ".join(errors) or "no route"))
            self._manifests.clear()
            return None

    def _install_adapter(self, v: int, tensors: dict[str, torch.Tensor], manifest: dict) -> float:
        """Hand a LoRA adapter version to the engine (which merges it into its pristine base weights), then check
        that the adapter it now serves hashes to the trainer's: an engine that did not take the update raises
        IntegrityError instead of serving a stale policy. Returns the engine's pause in ms."""
        update = getattr(self.engine, "update_adapter", None)
        if update is None:
            raise ValueError(f"version {v} is a LoRA adapter, and {type(self.engine).__name__} cannot apply adapters "
                             "(no update_adapter); use the local engine or train without trainer.lora")
        pause_ms = float(update(v, tensors, manifest["adapter"]) or 0.0)
        served = self.engine.served_adapter()
        entries = manifest["tensors"]
        if set(served) != set(entries):
            raise IntegrityError(f"version {v}: the engine serves adapter tensors {sorted(served)[:3]}…, the trainer "
                                 f"published {sorted(entries)[:3]}…")
        bad = [n for n, t in served.items() if manifest_hash(to_bits(t.detach().cpu()), entries[n],
                                                              manifest["format"]) != entries[n]["hash"]]
        if bad:
            raise IntegrityError(f"version {v}: the engine's adapter differs from the trainer's in {len(bad)} tensors "
                                 f"({bad[:3]}): it did not take the update")
        return pause_ms

    def _install_served(self, v: int, tensors: dict[str, torch.Tensor], manifest: dict) -> float:
        """Hand a version published in its served form (`served_format`: a quantized weight as the format's codes
        and scales) to the engine, which turns them into the values it serves without quantizing again, then
        check every served value against the sha256 the trainer computed of it (`manifest["served"]`): an engine
        that did not take the update, or rounded or quantized it again, raises IntegrityError. Returns the pause
        in ms."""
        fmt, expected = manifest["served_format"], manifest.get("served") or {}
        served = getattr(self.engine, "served_weights", None)
        if served is None:
            raise ValueError(f"version {v} is published as a {fmt} engine serves it, and {type(self.engine).__name__} "
                             "does not fake-quantize: use the local engine with inference.weight_dtype = "
                             f"'{fmt}', or weights.publish_served = false on the trainer")
        # an engine of another weight_dtype refuses it, naming the key
        pause_ms = float(self.engine.update_weights(v, tensors, served_format=fmt) or 0.0)
        held = served(list(expected))
        bad = [n for n, h in expected.items() if n not in held or bits_hash(to_bits(held[n].cpu())) != h]
        if bad:
            raise IntegrityError(f"version {v}: the engine serves other values than the {fmt} weights published in "
                                 f"{len(bad)} tensors ({bad[:3]}): it changed them on installing")
        return pause_ms

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as err:  # a long run never dies of a bad version
                self.last_error = err
                log.exception("weight subscriber poll failed")
            self._stop.wait(self.poll_interval_s)

    def start(self) -> Subscriber:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="weights-subscriber", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.stop()
        self._fetch.shutdown(wait=True)
        self._decode.shutdown(wait=True)


def _itemsize(dt: str) -> int:
    if dt not in DTYPES:
        raise ValueError(f"manifest dtype '{dt}' is unknown")
    return torch.empty(0, dtype=DTYPES[dt]).element_size()


def _cost(m: dict, key: str) -> int:
    return sum(n for t in m["tensors"].values() for _, n in (t.get(key) or []))
