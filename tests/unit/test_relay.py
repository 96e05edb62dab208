"""Relay: an origin serving a store, a relay with a bandwidth cap, several subscriber processes pulling once."""

import json
import subprocess
import sys
import time

import torch

from flywheel.weights.relay import HttpStore, RelayServer
from flywheel.weights.sync import Publisher, Subscriber

WORKER = """
import hashlib, sys
from flywheel.weights.sync import Subscriber
sub = Subscriber(sys.argv[1], streams=4)
assert sub.poll() == 1, sub.last_error
h = hashlib.sha256(b"".join(sub.tensors[k].view(-1).view(__import__("torch").uint8).numpy().tobytes()
                           for k in sorted(sub.tensors)))
print(h.hexdigest())
"""


def test_relay_fans_out_to_subscriber_processes_and_pulls_once(tmp_path):
    g = torch.Generator().manual_seed(0)
    v0 = {"w": torch.randn(200_000, generator=g).bfloat16(), "b": torch.randn(100, generator=g)}
    v1 = {"w": (v0["w"].float() + 1e-3 * torch.randn(200_000, generator=g)).bfloat16(), "b": v0["b"] + 1}
    with Publisher(str(tmp_path), chunk_mb=0.05) as pub:
        pub.publish(0, v0)
        pub.publish(1, v1)
    origin = RelayServer(store=str(tmp_path))
    relay = RelayServer(upstream=origin.start(), bandwidth_mbps=20.0, streams=4)
    url = relay.start()
    try:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, url], stdout=subprocess.PIPE, text=True)
                 for _ in range(3)]
        outs = [p.communicate(timeout=120)[0].strip() for p in procs]
        assert all(p.returncode == 0 for p in procs)
        local = Subscriber(str(tmp_path))
        assert local.poll() == 1
        import hashlib
        want = hashlib.sha256(b"".join(local.tensors[k].view(-1).view(torch.uint8).numpy().tobytes()
                                       for k in sorted(local.tensors))).hexdigest()
        assert outs == [want] * 3
        m0, m1 = HttpStore(url).read_manifest(0), HttpStore(url).read_manifest(1)
        needed = {c for t in m0["tensors"].values() for c, _ in t["full"]} | {
            c for t in m1["tensors"].values() for c, _ in t["delta"]}
        # a fresh subscriber takes anchor v0 + delta v1; each chunk came from upstream once for three asks
        assert relay.stats["num_upstream_chunks"] == len(needed)
        assert relay.stats["bytes_out"] > 3 * relay.stats["bytes_upstream"] * 0.9
    finally:
        relay.stop()
        origin.stop()


def test_bandwidth_cap_paces_egress(tmp_path):
    w = {"w": torch.randn(1_000_000, generator=torch.Generator().manual_seed(1))}  # ~3.7 MB compressed
    with Publisher(str(tmp_path), chunk_mb=0.5) as pub:
        pub.publish(0, w)
    relay = RelayServer(store=str(tmp_path), bandwidth_mbps=2.0)
    url = relay.start()
    try:
        sub = Subscriber(url, streams=4)
        t0 = time.perf_counter()
        assert sub.poll() == 0
        took = time.perf_counter() - t0
        mb = sub.metrics[-1]["bytes_fetched"] / 1e6
        assert took >= (mb - 2.0) / 2.0 * 0.9  # one second of burst, then 2 MB/s
        assert torch.equal(sub.tensors["w"], w["w"])
    finally:
        relay.stop()


def test_relay_cli_serves_a_store(tmp_path):
    with Publisher(str(tmp_path)) as pub:
        pub.publish(5, {"x": torch.arange(10, dtype=torch.float32)})
    p = subprocess.Popen([sys.executable, "-m", "flywheel.weights.relay", "--store", str(tmp_path), "--port", "0"],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        assert line.startswith("serving on http://127.0.0.1:")
        store = HttpStore(line.split()[-1])
        assert store.list_versions() == [5]
        assert json.loads(json.dumps(store.read_manifest(5)))["version"] == 5
        sub = Subscriber(store)
        assert sub.poll() == 5 and torch.equal(sub.tensors["x"], torch.arange(10, dtype=torch.float32))
    finally:
        p.terminate()
        p.wait(10)
