"""Sharded publication: every trainer rank encodes the chunks of its own shards; rank 0 writes one manifest.

    pub = ShardedPublisher.from_config(store, group, cfg.weights, dtype="bfloat16")   # on every rank
    metrics = pub.publish(version, trainer.state_dict_for_publish())   # a collective: every rank calls it
    pub.close()

The result is the store an unsharded `Publisher` (weights/sync.py) would write for the same weights: the same
chunks (the same bytes, so the same content ids), the same tensor hashes, one manifest naming every chunk; the
tests compare the two manifests entry for entry (`test_sharded_publish.py`). Subscribers need no change.

How. A tensor's chunks are fixed ranges of `chunk_elems` elements over its flattened bits, whatever the world
size. An FSDP2 shard (`Shard(0)`) is a contiguous range of rows, so a contiguous range of those elements. A chunk
that lies inside one rank's range is encoded by that rank; one that straddles a shard boundary is encoded by the
rank holding most of it, which receives the missing elements (less than one chunk per boundary) from its
neighbours in one point-to-point exchange. A tensor smaller than a chunk is split by FSDP too; those go to the
ranks round-robin, so each rank receives about 1/world_size of such tensors, never the model. Every rank keeps the
bits of the chunks it owns for the next delta,
writes its chunks to the store itself (object stores take parallel uploads), and sends rank 0 only chunk ids,
sizes and per-chunk sha256 digests: the tensor hash of manifest format 2 is a hash over those digests
(weights/tensors.py), so no rank ever holds a whole tensor, let alone the model. Rank 0 writes the manifest after
every rank has reported, i.e. after every chunk is stored. Replicated (plain) tensors are split round-robin
by chunk over the ranks.

Unlike `Publisher`, `publish` runs on the caller's thread: it is a collective over the trainer's gloo group,
and the trainer's own collectives must not interleave with it. The cost is the encode time of 1/world_size of
the model (`flywheel bench trainer`: `publish_s_sharded`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from flywheel.weights.codec import chunk_num_changed, chunk_ranges, encode_chunk
from flywheel.weights.store import MANIFEST_FORMAT, WeightStore, chunk_id
from flywheel.weights.tensors import combine_digests, dtype_name, range_digest, to_bits


class RankGroup(Protocol):
    """What the publisher needs of the trainer's group (trainer/distributed.RankGroup): ranks numbered as in the
    default group, a gloo group for point-to-point bytes, object collectives."""

    rank: int
    world_size: int
    cpu_group: Any

    @property
    def is_main(self) -> bool: ...

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any: ...

    def gather_objects(self, obj: Any, dst: int = 0) -> list[Any] | None: ...

    def all_gather_objects(self, obj: Any) -> list[Any]: ...


@dataclass
class _Layout:
    """One tensor: global dtype/shape, every rank's flat element range, and the chunk plan."""

    dtype: str
    shape: tuple[int, ...]
    itemsize: int
    chunk_elems: int
    ranges: list[tuple[int, int]]  # per rank [start, stop) of the flattened tensor
    owners: list[int]  # per chunk: the rank that encodes it
    chunks: list[tuple[int, int]]  # per chunk [start, stop)


def _local_range(t: torch.Tensor, numel: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(this rank's part as a plain tensor, its flat [start, stop) in the full tensor)."""
    if isinstance(t, DTensor):
        if len(t.placements) != 1 or t.placements[0] != Shard(0):
            raise ValueError(f"sharded publish supports DTensors sharded on dim 0 over a 1-D mesh (FSDP2); got "
                             f"placements {t.placements}")
        local = t.to_local()
        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        row = int(np.prod(t.shape[1:], dtype=np.int64)) if t.dim() > 1 else 1
        start = int(offset[0]) * row if local.numel() else 0
        return local, (start, start + local.numel())
    return t, (0, numel)


def _plan(ranges: list[tuple[int, int]], chunks: list[tuple[int, int]], salt: int) -> list[int]:
    """Owner per chunk: the rank holding most of it; ties (a replicated tensor, a small tensor split evenly) go
    round-robin over the tied ranks by `salt + chunk index`, so small tensors spread over the ranks too."""
    owners = []
    for i, (a, b) in enumerate(chunks):
        overlap = [max(0, min(b, e) - max(a, s)) for s, e in ranges]
        best = max(overlap)
        tied = [r for r, n in enumerate(overlap) if n == best]
        owners.append(tied[(salt + i) % len(tied)])
    return owners


class ShardedPublisher:
    """Publisher for a sharded trainer; see the module docstring. Every method is called on every rank."""

    def __init__(self, store: WeightStore | str, group: RankGroup, anchor_every: int = 10, *, chunk_mb: float = 4.0,
                 zstd_level: int = 3, num_threads: int = 0, keep_versions: int | None = None,
                 dtype: str | None = None, gc_min_age_s: float = 60.0):
        if anchor_every < 1:
            raise ValueError(f"anchor_every must be >= 1, got {anchor_every}")
        if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"publisher dtype '{dtype}' is not a torch dtype name such as 'bfloat16'")
        self.store = store if isinstance(store, WeightStore) else WeightStore(store)
        self.group = group
        self.anchor_every = anchor_every
        self.chunk_bytes = max(1, int(chunk_mb * (1 << 20)))
        self.zstd_level = zstd_level
        self.keep_versions = keep_versions
        self.dtype = dtype
        self.gc_min_age_s = gc_min_age_s
        self.metrics: list[dict] = []
        self._pool = ThreadPoolExecutor(num_threads if num_threads > 0 else max(1, os.cpu_count() or 1),
                                        thread_name_prefix="weights-encode")
        self._layouts: dict[str, _Layout] | None = None
        self._prev: dict[tuple[str, int], np.ndarray] = {}  # (name, chunk) -> bits of an owned chunk
        self._prev_version: int | None = None
        self._last_anchor: int | None = None
        self._last_requested = group.broadcast_object(self.store.latest_version() if group.is_main else None)

    @classmethod
    def from_config(cls, store: WeightStore | str, group: RankGroup, cfg: Any, **kwargs: Any) -> ShardedPublisher:
        """Build from a `WeightsConfig`."""
        return cls(store, group, cfg.anchor_every, chunk_mb=cfg.chunk_mb, zstd_level=cfg.zstd_level,
                   num_threads=cfg.num_threads, keep_versions=cfg.keep_versions, **kwargs)

    # ------------------------------------------------------------------ layout and exchange

    def _snapshot(self, state_dict: Mapping[str, torch.Tensor]):
        """Per tensor: (local bits, dtype name, global shape, flat range) after the cast to the served dtype."""
        snap = {}
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"state_dict['{name}'] is {type(t).__name__}, not a torch.Tensor")
            dt = getattr(torch, self.dtype) if self.dtype and t.is_floating_point() else t.dtype
            numel = int(np.prod(tuple(t.shape), dtype=np.int64))
            local, rng = _local_range(t.detach(), numel)
            local = local.to(device="cpu", dtype=dt, copy=True).contiguous()
            snap[name] = (to_bits(local), dtype_name(dt), tuple(t.shape), rng)
        return snap

    def _layout(self, snap) -> dict[str, _Layout]:
        ranges = self.group.all_gather_objects({k: v[3] for k, v in snap.items()})
        out = {}
        for ordinal, (name, (bits, dt, shape, _)) in enumerate(snap.items()):
            n = int(np.prod(shape, dtype=np.int64))
            size = bits.dtype.itemsize
            chunk_elems = max(1, self.chunk_bytes // size)
            chunks = chunk_ranges(n, size, self.chunk_bytes)
            per_rank = [r[name] for r in ranges]
            out[name] = _Layout(dt, shape, size, chunk_elems, per_rank, _plan(per_rank, chunks, ordinal), chunks)
        return out

    def _exchange(self, snap, layouts: dict[str, _Layout]) -> tuple[dict[tuple[str, int], np.ndarray], int]:
        """Assemble the bits of every chunk this rank owns; returns them and the bytes this rank sent."""
        me, ws = self.group.rank, self.group.world_size
        send: dict[int, list[np.ndarray]] = {r: [] for r in range(ws)}
        recv_plan: dict[int, list[tuple[str, int, int, int]]] = {r: [] for r in range(ws)}
        owned: dict[tuple[str, int], np.ndarray] = {}
        for name, lay in layouts.items():
            bits = snap[name][0]
            s_me, e_me = lay.ranges[me]
            for i, ((a, b), owner) in enumerate(zip(lay.chunks, lay.owners)):
                if owner == me:
                    if s_me <= a and b <= e_me:
                        owned[(name, i)] = bits[a - s_me:b - s_me]
                        continue
                    owned[(name, i)] = np.empty(b - a, bits.dtype)
                    for r, (s, e) in enumerate(lay.ranges):
                        lo, hi = max(a, s), min(b, e)
                        if hi <= lo:
                            continue
                        if r == me:
                            owned[(name, i)][lo - a:hi - a] = bits[lo - s_me:hi - s_me]
                        else:
                            recv_plan[r].append((name, i, lo - a, hi - a))
                else:
                    lo, hi = max(a, s_me), min(b, e_me)
                    s_o, e_o = lay.ranges[owner]
                    if hi > lo and not (s_o <= a and b <= e_o):
                        send[owner].append(bits[lo - s_me:hi - s_me].view(np.uint8))
        ops, inbox, sent = [], {}, 0
        for r in range(ws):
            if r != me and send[r]:
                buf = torch.from_numpy(np.concatenate(send[r]))
                sent += buf.numel()
                ops.append(dist.P2POp(dist.isend, buf, r, self.group.cpu_group))
            if r != me and recv_plan[r]:
                size = sum((hi - lo) * layouts[name].itemsize for name, _, lo, hi in recv_plan[r])
                inbox[r] = torch.empty(size, dtype=torch.uint8)
                ops.append(dist.P2POp(dist.irecv, inbox[r], r, self.group.cpu_group))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        for r, plan in recv_plan.items():
            if r not in inbox:  # nothing to receive from r (or r is this rank)
                continue
            pos = 0
            data = inbox[r]
            for name, i, lo, hi in plan:
                size = layouts[name].itemsize
                owned[(name, i)][lo:hi] = data[pos:pos + (hi - lo) * size].numpy().view(owned[(name, i)].dtype)
                pos += (hi - lo) * size
        return owned, sent

    # ------------------------------------------------------------------ publish

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor],
                adapter: Mapping[str, Any] | None = None) -> dict:
        """Encode and store this rank's chunks of `version`; rank 0 writes the manifest. Returns the metrics
        (the same on every rank). A collective: every rank calls it with its own shards. `adapter`: the LoRA marker
        (`Trainer.publish_meta()`, as for `Publisher.publish`); a LoRA run's adapter tensors are whole on every rank
        and spread round-robin like any replicated tensor."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if self._last_requested is not None and version <= self._last_requested:
            raise ValueError(f"version {version} is not newer than {self._last_requested}; versions must increase")
        if not state_dict:
            raise ValueError("state_dict is empty; nothing to publish")
        t0 = time.perf_counter()
        snap = self._snapshot(state_dict)
        layouts = self._layout(snap)
        prev_layouts = self._layouts
        compatible = prev_layouts is not None and list(prev_layouts) == list(layouts) and all(
            (prev_layouts[k].dtype, prev_layouts[k].shape, prev_layouts[k].ranges) ==
            (layouts[k].dtype, layouts[k].shape, layouts[k].ranges) for k in layouts)
        anchor = not compatible or self._last_anchor is None or version - self._last_anchor >= self.anchor_every
        owned, sent = self._exchange(snap, layouts)
        snapshot_ms = (time.perf_counter() - t0) * 1e3

        t1 = time.perf_counter()

        def encode(item):
            key, new = item
            rec = {"digest": range_digest(new), "full": None, "delta": None, "changed": 0, "raw": new.nbytes}
            blobs = []
            if anchor:
                blob = encode_chunk(new, None, self.zstd_level)
                rec["full"] = [chunk_id(blob), len(blob)]
                blobs.append(blob)
            if compatible:
                blob = encode_chunk(new, self._prev[key], self.zstd_level)
                rec["delta"] = [chunk_id(blob), len(blob)]
                rec["changed"] = chunk_num_changed(blob)
                blobs.append(blob)
            for blob in blobs:
                self.store.put_chunk(blob)
            return key, rec

        records = dict(self._pool.map(encode, owned.items()))
        encode_ms = (time.perf_counter() - t1) * 1e3
        self._prev = owned  # views of this publish's own snapshot (a fresh copy) or assembled arrays: no copy
        self._layouts = layouts
        gathered = self.group.gather_objects({"records": records, "encode_ms": encode_ms, "sent": sent})
        result: Any = None
        if self.group.is_main:
            assert gathered is not None, "the main rank receives every rank's records"
            try:
                result = self._write_manifest(version, anchor, compatible, layouts, gathered,
                                              dict(adapter) if adapter else None)
                result.update(snapshot_ms=snapshot_ms, publish_ms=(time.perf_counter() - t0) * 1e3)
            except Exception as err:  # told to every rank, so none is left waiting
                result = f"{type(err).__name__}: {err}"
        result = self.group.broadcast_object(result)
        if isinstance(result, str):
            raise RuntimeError(f"sharded publish of version {version} failed on rank 0: {result}")
        self._last_requested = version
        self._prev_version = version
        if anchor:
            self._last_anchor = version
        self.metrics.append(result)
        return result

    def _write_manifest(self, version: int, anchor: bool, compatible: bool, layouts: dict[str, _Layout],
                        gathered: list[dict], adapter: dict | None = None) -> dict:
        t0 = time.perf_counter()
        records: dict[tuple[str, int], dict] = {}
        for g in gathered:
            records.update(g["records"])
        tensors: dict[str, dict] = {}
        raw_bytes = full_bytes = delta_bytes = num_changed = num_elements = 0
        for name, lay in layouts.items():
            recs = [records[(name, i)] for i in range(len(lay.chunks))]
            entry: dict[str, Any] = {"dtype": lay.dtype, "shape": list(lay.shape),
                                     "hash": combine_digests([r["digest"] for r in recs]),
                                     "chunk_elems": lay.chunk_elems, "full": None, "delta": None}
            if anchor:
                entry["full"] = [r["full"] for r in recs]
                full_bytes += sum(r["full"][1] for r in recs)
            if compatible:
                entry["delta"] = [r["delta"] for r in recs]
                delta_bytes += sum(r["delta"][1] for r in recs)
                num_changed += sum(r["changed"] for r in recs)
            raw_bytes += sum(r["raw"] for r in recs)
            num_elements += lay.chunks[-1][1]
            tensors[name] = entry
        manifest = {"format": MANIFEST_FORMAT, "version": version, "anchor": anchor,
                    "base": self._prev_version if compatible else None, "created_s": time.time(),
                    "raw_bytes": raw_bytes, "full_bytes": full_bytes, "delta_bytes": delta_bytes, "tensors": tensors}
        if adapter is not None:
            manifest["adapter"] = adapter
        self.store.write_manifest(manifest)
        gc = self.store.gc(self.keep_versions, self.gc_min_age_s) if self.keep_versions else None
        published = full_bytes + delta_bytes
        return {"version": version, "anchor": anchor, "base": manifest["base"], "bytes_published": published,
                "raw_bytes": raw_bytes, "ratio": published / max(raw_bytes, 1),
                "delta_ratio": delta_bytes / max(raw_bytes, 1) if compatible else None,
                "changed_fraction": num_changed / max(num_elements, 1) if compatible else None,
                "encode_ms": max(g["encode_ms"] for g in gathered),
                "exchange_bytes": sum(g["sent"] for g in gathered),
                "manifest_ms": (time.perf_counter() - t0) * 1e3, "gc": gc}

    def flush(self) -> None:
        """Nothing is pending: `publish` returns when the version is in the store."""

    def close(self) -> None:
        self._pool.shutdown(wait=True)
