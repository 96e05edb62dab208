"""Priority on the real engine (inference/local.py + scheduler.py): users finish before background requests queued
earlier, background rows never exceed their cap, and a request's tokens and log-probs do not depend on the
background load beside it (bit-identical in batch-invariant mode, greedy and seeded sampling)."""

import asyncio
import random

import pytest

from flywheel.config import ModelConfig
from flywheel.inference.local import LocalEngine
from flywheel.policy.model import build_model
from flywheel.types import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return build_model(ModelConfig(preset="tiny", max_seq_len=256), vocab_size=2048)


def _prompt(seed, n=20):
    rng = random.Random(seed)
    return [rng.randrange(2048) for _ in range(n)]


def test_users_queued_after_background_finish_first_and_the_cap_holds(tiny):
    async def main():
        engine = LocalEngine(tiny, max_batch_size=3, max_background_rows=1)
        order: list[str] = []
        async with engine:
            engine.pause()  # queue everything before the first step, background first
            sp = SamplingParams(temperature=0.0, max_new_tokens=6)
            tasks = []
            for i in range(3):
                t = asyncio.ensure_future(engine.generate(_prompt(i), sp, priority="background"))
                t.add_done_callback(lambda _, n=f"b{i}": order.append(n))
                tasks.append(t)
            await asyncio.sleep(0.05)
            for i in range(2):
                t = asyncio.ensure_future(engine.generate(_prompt(10 + i), sp))
                t.add_done_callback(lambda _, n=f"u{i}": order.append(n))
                tasks.append(t)
            await asyncio.sleep(0.05)
            engine.resume()
            gens = await asyncio.gather(*tasks)
        assert all(len(g.token_ids) == 6 for g in gens)
        assert set(order[:2]) == {"u0", "u1"}, order  # queued last, admitted (and done) first
        assert engine.peak_background_rows == 1  # one background row at a time, though two slots were free later
        with pytest.raises(ValueError, match="priority must be one of"):
            await engine.generate([1, 2], sp, priority="urgent")  # type: ignore[arg-type]

    asyncio.run(main())


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=5)], ids=["greedy", "seeded"])
def test_a_users_tokens_do_not_depend_on_background_load(tiny, sampling):
    async def main():
        engine = LocalEngine(tiny, max_batch_size=8, max_background_rows=6, batch_invariant=True)
        user = SamplingParams(max_new_tokens=24, **sampling)
        async with engine:
            alone = await engine.generate(_prompt(99), user)
            background = [asyncio.ensure_future(engine.generate(
                _prompt(i, 5 + 9 * i), SamplingParams(temperature=1.0, max_new_tokens=60, seed=i),
                priority="background")) for i in range(6)]
            while engine.peak_background_rows < 6:  # the user joins a batch full of background rows
                await asyncio.sleep(0.005)
            loaded = await engine.generate(_prompt(99), user)
            assert not all(b.done() for b in background)  # they really ran beside the user's request
            await asyncio.gather(*background)
        assert loaded.token_ids == alone.token_ids
        assert loaded.logprobs == alone.logprobs  # bit-identical, not close

    asyncio.run(main())
