"""Prefix reuse (inference/prefix_cache.py): the store's rules, and the engine's results with reuse against
the same engine prefilling every prompt whole."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

from flywheel.config import ModelConfig
from flywheel.inference.local import LocalEngine
from flywheel.inference.prefix_cache import PrefixStore, common_prefix
from flywheel.modeling.decoder import KVCache
from flywheel.policy.model import build_model
from flywheel.types import SamplingParams

GREEDY = dict(temperature=0.0)


def _cache(n: int) -> KVCache:
    return KVCache(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4), length=n)


def test_common_prefix() -> None:
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, np.array([1, 2])) == 2
    assert common_prefix(a, np.array([7])) == 0
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0


def test_store_lookup_rules() -> None:
    store = PrefixStore(max_bytes=1 << 20, min_tokens=3)
    c = _cache(10)
    store.add(list(range(10)), c, version=0)
    store.add([1, 2], _cache(2), version=0)  # shorter than min_tokens: not kept
    assert len(store) == 1
    assert store.lookup(list(range(6)) + [99], 0) == (c, 6)
    assert store.lookup(list(range(10)), 0) == (c, 9)  # one position is always left to prefill
    assert store.lookup([0, 1, 5, 5], 0) == (None, 0)  # 2 < min_tokens
    live = _cache(12)
    assert store.lookup(list(range(12)) + [5], 0, live=[(list(range(12)), live, 0)]) == (live, 12)
    assert store.lookup(list(range(12)) + [5], 0, live=[(list(range(12)), live, -1)]) == (c, 10)  # mixed versions
    assert store.lookup(list(range(8)), 1) == (None, 0) and len(store) == 0  # another version: dropped
    assert store.stats["hits"] == 4 and store.stats["lookups"] == 6


def test_store_evicts_least_recently_used_by_bytes() -> None:
    one = 2 * 10 * 4 * 4  # bytes of a _cache(10)
    store = PrefixStore(max_bytes=2 * one, min_tokens=1)
    a, b, c = _cache(10), _cache(10), _cache(10)
    store.add([1] * 10, a, 0)
    store.add([2] * 10, b, 0)
    assert store.lookup([1] * 5, 0)[0] is a  # a is now the most recently used
    store.add([3] * 10, c, 0)  # evicts b
    assert store.nbytes == 2 * one and store.lookup([2] * 5, 0) == (None, 0)
    assert store.lookup([1] * 5, 0)[0] is a and store.lookup([3] * 5, 0)[0] is c


@pytest.fixture(scope="module")
def tiny():
    return build_model(ModelConfig(preset="tiny", max_seq_len=512), vocab_size=2048)


def _sessions(engine: LocalEngine, prompts: list[list[int]], turns: int, seed: int):
    """Agent-like sessions: each turn's prompt is the last prompt + the tokens generated + an 'observation'."""
    async def one(i: int, prompt: list[int]):
        rng = random.Random(seed + i)
        out = []
        for _ in range(turns):
            g = await engine.generate(prompt, SamplingParams(max_new_tokens=12, **GREEDY))
            out.append(g)
            prompt = prompt + g.token_ids + [rng.randrange(2048) for _ in range(rng.randint(5, 30))]
        return out

    async def main():
        async with engine:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(main())


def test_engine_with_reuse_generates_what_it_does_without(tiny) -> None:
    rng = random.Random(0)
    shared = [rng.randrange(2048) for _ in range(60)]
    prompts = [shared + [rng.randrange(2048) for _ in range(rng.randint(0, 20))] for _ in range(6)]
    prompts += [list(prompts[0])] * 3  # a group: the same prompt several times
    plain = _sessions(LocalEngine(tiny), prompts, turns=3, seed=1)
    engine = LocalEngine(tiny, prefix_cache_mb=64)
    reused = _sessions(engine, prompts, turns=3, seed=1)
    stats = engine.prefix_cache.stats
    assert stats["hits"] >= 8 and stats["tokens_reused"] > stats["tokens_prefilled"], stats
    for a_turns, b_turns in zip(plain, reused):
        for a, b in zip(a_turns, b_turns):
            assert a.prompt_len == b.prompt_len
            assert b.token_ids == a.token_ids  # greedy: the same continuation
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_a_weight_swap_retires_older_prefixes(tiny) -> None:
    engine = LocalEngine(tiny, prefix_cache_mb=64)
    prompt = list(range(100, 160))

    async def main():
        async with engine:
            await engine.generate(prompt, SamplingParams(max_new_tokens=4, **GREEDY))
            await engine.generate(prompt + [5], SamplingParams(max_new_tokens=4, **GREEDY))
            hits = engine.prefix_cache.stats["hits"]
            engine.update_weights(1, {"lm_head.weight": tiny.lm_head.weight.detach().clone()})
            await engine.generate(prompt + [6], SamplingParams(max_new_tokens=4, **GREEDY))
            return hits, engine.prefix_cache.stats["hits"]

    before, after = asyncio.run(main())
    assert before == 1 and after == 1  # nothing from version 0 served version 1
