"""Prefix reuse for the local engine: a request starts from the keys and values of the longest prefix of its
prompt that the engine already computed, and prefills only the rest.

Why: an agent session resends its whole context every turn (turn t+1's prompt is turn t's prompt, the tokens
sampled, then the observation), and the G sessions of a group start from one prompt. Without reuse, prefill
took 47 % of the engine's time in an RL run of the demo (py-spy, `tiny` preset): every turn prefilled the
system prompt, the tool list, the task and all earlier turns again, eight times per group.

Sources are the caches of finished requests (kept, least recently used first out, within `max_bytes`) and
of requests still running (read, never written: positions before a running request's length do not change
while it decodes). Only caches written wholly under the current weight version are reused: keys and values
of older weights would make a new request's tokens depend on weights the trainer no longer has (a running
request that crosses a swap already does; this keeps new requests out of it). The engine calls this from
its decode thread only; nothing here is thread-safe.

    store = PrefixStore(max_bytes=512 << 20, min_tokens=16)
    cache, n = store.lookup(prompt_ids, version, live=[(tokens, cache, version), ...])  # n tokens reusable
    store.add(tokens, cache, version)     # a finished request: `tokens` are the positions its cache holds
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PrefixStore", "common_prefix"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two 1-D integer arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


def cache_bytes(cache: Any) -> int:
    return 2 * cache.k.numel() * cache.k.element_size()


@dataclass
class _Entry:
    tokens: np.ndarray
    cache: Any
    version: int
    nbytes: int


class PrefixStore:
    """Finished requests' KV caches by the tokens they hold, and the lookup over them and the running ones."""

    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        self.max_bytes = int(max_bytes)
        self.min_tokens = max(1, int(min_tokens))
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self._bytes = 0
        self.stats = {"lookups": 0, "hits": 0, "tokens_reused": 0, "tokens_prefilled": 0}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def add(self, tokens: Sequence[int], cache: Any, version: int) -> None:
        """Keep `cache`, which holds the keys and values of `tokens` (all written under `version`)."""
        if len(tokens) < self.min_tokens or self.max_bytes <= 0:
            return
        nbytes = cache_bytes(cache)
        if nbytes > self.max_bytes:
            return
        self._entries[self._next_key] = _Entry(np.asarray(tokens, dtype=np.int64), cache, int(version), nbytes)
        self._next_key += 1
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self._bytes -= e.nbytes
        release = getattr(e.cache, "release", None)  # a KV-pool slot goes back to the pool now
        if release is not None:
            release()

    def lookup(self, prompt: Sequence[int], version: int,
               live: Iterable[tuple[Sequence[int], Any, int]] = ()) -> tuple[Any, int]:
        """(cache, n): a cache whose first n positions hold prompt[:n] under `version`, n < len(prompt) so
        that at least one position is left to prefill; (None, 0) when no prefix of min_tokens is known.
        Entries of other versions are dropped on the way (they can never be used again)."""
        self.stats["lookups"] += 1
        p = np.asarray(prompt, dtype=np.int64)
        limit = len(p) - 1
        best_cache, best_n, best_key = None, 0, None
        for key in [k for k, e in self._entries.items() if e.version != version]:
            self._drop(key)
        for key, e in self._entries.items():
            n = min(common_prefix(e.tokens, p), limit)
            if n > best_n:
                best_cache, best_n, best_key = e.cache, n, key
        for tokens, cache, v in live:
            if v == version:
                n = min(common_prefix(np.asarray(tokens, dtype=np.int64), p), limit)
                if n > best_n:
                    best_cache, best_n, best_key = cache, n, None
        if best_n < self.min_tokens:
            self.stats["tokens_prefilled"] += len(p)
            return None, 0
        if best_key is not None:
            self._entries.move_to_end(best_key)
        self.stats["hits"] += 1
        self.stats["tokens_reused"] += best_n
        self.stats["tokens_prefilled"] += len(p) - best_n
        return best_cache, best_n
