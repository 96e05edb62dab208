"""Publisher/Subscriber: bit-exact install into a real model, route choice, corruption, fallback, refusal."""

import os

import pytest
import torch

from flywheel.config import ModelConfig
from flywheel.inference.local import LocalEngine
from flywheel.policy.model import build_model
from flywheel.weights.sync import Publisher, Subscriber


@pytest.fixture(scope="module")
def versions():
    """Five bf16 versions of the tiny model trained by AdamW (fp32 masters), like an RL trainer's."""
    model = build_model(ModelConfig(preset="tiny"), vocab_size=512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out = []
    for step in range(5):
        ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(step))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        out.append({k: v.detach().bfloat16() for k, v in model.named_parameters()})
    return out


def _receiver():
    return LocalEngine(build_model(ModelConfig(preset="tiny", dtype="bfloat16"), vocab_size=512))


def _same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def test_publish_then_subscribe_bit_exact_into_model(tmp_path, versions):
    eng = _receiver()
    sub = Subscriber(str(tmp_path), eng, streams=4)
    with Publisher(str(tmp_path), anchor_every=3, chunk_mb=0.05, dtype="bfloat16") as pub:
        for v, sd in enumerate(versions):
            live = {k: t.float().clone() for k, t in sd.items()}
            pub.publish(v, live)
            for t in live.values():  # the caller may mutate right after publish returns
                t.add_(1.0)
            pub.flush()
            assert sub.poll() == v
            assert _same(dict(eng.model.named_parameters()), sd) and eng.version == v
    m = pub.metrics[1]
    assert not m["anchor"] and 0 < m["changed_fraction"] < 1 and m["ratio"] < 0.5
    assert [x["path"] for x in sub.metrics] == ["anchor", "delta", "delta", "delta", "delta"]
    assert sub.metrics[1]["bytes_fetched"] < sub.metrics[0]["bytes_fetched"] / 2
    assert all(x["pause_ms"] >= 0 and x["fetch_ms"] > 0 for x in sub.metrics)


def test_lagging_subscriber_takes_cheaper_route(tmp_path, versions):
    with Publisher(str(tmp_path), anchor_every=3, chunk_mb=0.05) as pub:
        pub.publish(0, versions[0])
    sub = Subscriber(str(tmp_path))
    assert sub.poll() == 0
    with Publisher(str(tmp_path), anchor_every=3, chunk_mb=0.05) as pub:  # new publisher: v1 is an anchor
        for v in range(1, 5):
            pub.publish(v, versions[v])
    assert sub.poll() == 4
    assert sub.metrics[-1]["path"] == "anchor" and sub.metrics[-1]["num_steps"] == 1  # v1 has no base; v4 is an anchor
    assert _same(sub.tensors, versions[4])


def _chunk_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root / "chunks") for f in fs]


def test_corrupt_delta_falls_back_to_anchor_and_bad_everything_keeps_last_good(tmp_path, versions):
    eng = _receiver()
    sub = Subscriber(str(tmp_path), eng, max_retries=1)
    with Publisher(str(tmp_path), anchor_every=2, chunk_mb=0.05) as pub:
        pub.publish(0, versions[0]).result()
        assert sub.poll() == 0
        before = set(_chunk_files(tmp_path))
        pub.publish(1, versions[1]).result()
        pub.publish(2, versions[2]).result()  # anchor + delta
    m2 = sub.source.read_manifest(2)
    delta_ids = {c for t in m2["tensors"].values() for c, _ in t["delta"]}
    full_ids = {c for t in m2["tensors"].values() for c, _ in t["full"]}
    victim = next(p for p in _chunk_files(tmp_path) if os.path.basename(p) in delta_ids - full_ids)
    with open(victim, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff\xff")
    assert sub.poll() == 2
    assert sub.metrics[-1]["fallback"] and sub.metrics[-1]["path"] == "anchor"
    assert _same(dict(eng.model.named_parameters()), versions[2])
    # now break every chunk of v3's routes: the subscriber keeps v2, engine untouched
    with Publisher(str(tmp_path), anchor_every=1, chunk_mb=0.05) as pub:
        pub.publish(3, versions[3]).result()
    for p in set(_chunk_files(tmp_path)) - before:
        if os.path.basename(p) not in delta_ids | full_ids:
            os.remove(p)
    assert sub.poll() is None and sub.version == 2 and sub.last_error is not None
    assert _same(dict(eng.model.named_parameters()), versions[2]) and eng.version == 2


def test_missing_base_and_engine_refusal(tmp_path, versions):
    with Publisher(str(tmp_path), anchor_every=10, chunk_mb=0.05) as pub:
        pub.publish(0, versions[0])
    sub = Subscriber(str(tmp_path), _receiver())
    assert sub.poll() == 0
    with Publisher(str(tmp_path), anchor_every=10, chunk_mb=0.05) as pub:
        pub.publish(1, versions[1])  # anchor (fresh publisher)
        pub.publish(2, versions[2])
    os.remove(tmp_path / "versions" / f"{1:012d}.json")  # base of v2 and the only anchor are gone
    assert sub.poll() is None and sub.version == 0 and "v2" in str(sub.last_error)
    # an engine that refuses the names keeps its old version
    wrong = LocalEngine(build_model(ModelConfig(preset="tiny", dtype="bfloat16"), vocab_size=256))
    sub2 = Subscriber(str(tmp_path / "other"), wrong)
    with Publisher(str(tmp_path / "other")) as pub:
        pub.publish(0, versions[0])
    assert sub2.poll() is None and sub2.version is None and "the model expects" in str(sub2.last_error)


def test_background_subscriber(tmp_path, versions):
    sub = Subscriber(str(tmp_path), poll_interval_s=0.02).start()
    try:
        with Publisher(str(tmp_path), chunk_mb=0.05) as pub:
            pub.publish(0, versions[0])
            pub.publish(1, versions[1])
        import time
        end = time.time() + 10
        while sub.version != 1 and time.time() < end:
            time.sleep(0.02)
    finally:
        sub.close()
    assert sub.version == 1 and _same(sub.tensors, versions[1])
