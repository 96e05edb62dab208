"""The weight store: atomic versions under concurrent publish/read, retention/GC, unwritable disks, fsspec URLs."""

import os
import threading

import pytest
import torch

from flywheel.weights.store import StoreError, WeightStore, chunk_id, referenced_chunks
from flywheel.weights.sync import Publisher, Subscriber


def _sd(seed, n=20_000):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g).bfloat16(), "b": torch.randn(64, generator=g)}


def test_reader_never_sees_a_half_written_version(tmp_path):
    store = WeightStore(str(tmp_path))
    pub = Publisher(store, anchor_every=3, chunk_mb=0.01, num_threads=2)
    stop = threading.Event()
    checked, problems = set(), []

    def reader():
        while not stop.is_set():
            for v in store.list_versions():
                try:
                    m = store.read_manifest(v)
                    for cid in referenced_chunks(m):
                        if chunk_id(store.get_chunk(cid)) != cid:
                            problems.append((v, cid))
                    checked.add(v)
                except Exception as err:  # any failure here is a visible half-written version
                    problems.append((v, repr(err)))

    t = threading.Thread(target=reader)
    t.start()
    base = _sd(0)
    for v in range(12):
        base = {"w": (base["w"].float() + 0.01 * torch.randn(20_000)).bfloat16(), "b": base["b"] + 1}
        pub.publish(v, base)
    pub.close()
    stop.set()
    t.join()
    assert not problems
    assert len(checked) >= 3 and store.list_versions() == list(range(12))
    assert not [f for f in os.listdir(tmp_path / "versions") if f.startswith(".tmp")]


def test_gc_keeps_what_live_manifests_need(tmp_path):
    store = WeightStore(str(tmp_path))
    with Publisher(store, anchor_every=4, chunk_mb=0.01) as pub:
        sd = _sd(1)
        for v in range(10):
            sd = {"w": (sd["w"].float() * 1.01).bfloat16(), "b": sd["b"] * 2}
            pub.publish(v, sd)
    stats = store.gc(keep_versions=2, min_age_s=0)
    kept = store.list_versions()
    assert kept == [8, 9]  # 8 is an anchor (0, 4, 8): chains end there
    assert stats["num_manifests_deleted"] == 8 and stats["num_chunks_deleted"] > 0
    live = set().union(*(referenced_chunks(store.read_manifest(v)) for v in kept))
    assert all(chunk_id(store.get_chunk(c)) == c for c in live)
    sub = Subscriber(store)
    assert sub.poll() == 9 and torch.equal(sub.tensors["b"], sd["b"])
    # keep 1 of a delta version: its chain back to the anchor stays
    with Publisher(store, anchor_every=4, chunk_mb=0.01) as pub:
        pub.publish(10, sd)  # a fresh publisher anchors first
        pub.publish(11, {"w": sd["w"], "b": sd["b"] + 1})
    store.gc(keep_versions=1, min_age_s=0)
    assert store.list_versions() == [10, 11]


def test_unwritable_store_is_a_clear_error_and_publisher_recovers(tmp_path, monkeypatch):
    store = WeightStore(str(tmp_path))
    pub = Publisher(store, anchor_every=10, chunk_mb=0.01)
    real = os.replace

    def full_disk(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StoreError, match="disk full or read-only"):
        pub.publish(0, _sd(2)).result()
    assert store.list_versions() == []
    monkeypatch.setattr(os, "replace", real)
    pub.publish(1, _sd(3)).result()
    assert store.list_versions() == [1] and store.read_manifest(1)["anchor"]
    pub.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path):
    store = WeightStore(str(tmp_path))
    os.chmod(tmp_path / "versions", 0o500)
    os.chmod(tmp_path / "chunks", 0o500)
    try:
        with pytest.raises(StoreError):
            Publisher(store).publish(0, _sd(4)).result()
    finally:
        os.chmod(tmp_path / "versions", 0o700)
        os.chmod(tmp_path / "chunks", 0o700)


def test_memory_url_and_bad_input(tmp_path):
    store = WeightStore("memory://fw-test-store")
    with Publisher(store) as pub:
        pub.publish(0, _sd(5))
        with pytest.raises(ValueError, match="not newer"):
            pub.publish(0, _sd(5))
        with pytest.raises(TypeError, match="not a torch.Tensor"):
            pub.publish(1, {"x": [1, 2]})
    assert Subscriber(store).poll() == 0
    with pytest.raises(StoreError, match="not in weight store"):
        store.read_manifest(7)
    with pytest.raises(ValueError, match="chunk id"):
        store.get_chunk("../../etc/passwd")
    with pytest.raises(ValueError, match="immutable"):
        store.write_manifest(store.read_manifest(0))
