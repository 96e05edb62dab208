"""`flywheel serve` as a real child process on loopback, driven by the official `openai` client: chat completions
with tools and streaming, token-exact records, feedback, 4xx for every bad request (changing nothing), deploy and
rollback through the weight store under load, and `kill -9` mid-stream losing nothing acknowledged."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch

from flywheel.online.events import CompletionRecord, EventLog
from flywheel.online.keys import new_key
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.policy.chat import ChatFormat
from flywheel.policy.model import load_model
from flywheel.policy.tokenizer import load_tokenizer
from flywheel.types import Message
from flywheel.weights.sync import Publisher


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    """A tiny 2-layer policy and its tokenizer, saved once."""
    return build_policy(tmp_path_factory.mktemp("online-policy") / "model")

SERVE_ONLY = ["--online.learner.enabled=false", "--online.serve.deploy_poll_s=0.1", "--online.serve.key_recheck_s=0.5"]
TOOLS = [{"type": "function", "function": {"name": "view", "description": "show a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


@pytest.fixture(scope="module")
def server(policy_dir, tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("online-serve") / "run", policy_dir, SERVE_ONLY)
    yield srv
    srv.kill()  # nothing to flush: every acknowledged write is committed


def _client(srv, key=None):
    return openai.OpenAI(base_url=srv.base_url, api_key=key or srv.key_file.read_text().strip(), max_retries=0)


def test_openai_client_gets_token_exact_completions_tools_streaming_and_feedback(server, policy_dir):
    c = _client(server)
    (model,) = c.models.list().data
    assert model.id == "flywheel" and model.model_extra["weight_version"] == 0
    elog = EventLog(server.run_dir / "online.db")
    tok = load_tokenizer(policy_dir)
    msgs = [{"role": "user", "content": "Continue this line:\nvalue = "}]

    r = c.chat.completions.create(model="flywheel", messages=msgs, max_tokens=8, seed=3)
    assert r.id.startswith("chatcmpl-") and r.model_extra["weight_version"] == 0
    rec = elog.completion(r.id)
    assert rec.prompt_ids == ChatFormat(tok).render([Message("user", msgs[0]["content"])])
    assert len(rec.token_ids) == len(rec.logprobs) == len(rec.versions) == r.usage.completion_tokens
    # the reply's content is the turn as shown: its text and any call it could not use (online/server.py)
    assert ChatFormat(tok).parse(tok.decode(rec.token_ids)).shown == (r.choices[0].message.content or "")

    chunks = list(c.chat.completions.create(model="flywheel", messages=msgs, max_tokens=12, stream=True))
    assert len({ch.id for ch in chunks}) == 1 and chunks[-1].choices[0].finish_reason in ("stop", "length")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    srec = elog.completion(chunks[0].id)
    assert streamed == ChatFormat(tok).parse(tok.decode(srec.token_ids)).shown  # a cut call too, once parsed

    t = c.chat.completions.create(model="flywheel", messages=msgs, max_tokens=4, tools=TOOLS)
    trec = elog.completion(t.id)
    assert trec.prompt_ids == ChatFormat(tok, [TOOLS[0]["function"]]).render([Message("user", msgs[0]["content"])])
    assert trec.meta["tools"] is True

    fb = c.post("/feedback", body={"completion_id": r.id, "signal": "accept", "diff": "+x"}, cast_to=httpx.Response)
    got = [f for f, _ in elog.feedback_after(0) if f.completion_id == r.id]
    assert fb.json()["seq"] == got[0].seq and got[0].signal == "accept" and got[0].diff == "+x"


def test_bad_requests_get_a_clear_4xx_and_change_nothing(server):
    elog = EventLog(server.run_dir / "online.db")
    small, small_rec = new_key("small", 2, 4096)
    elog.add_key(small_rec)
    other, other_rec = new_key("other", 600, 1 << 20)
    elog.add_key(other_rec)
    mine = _client(server).chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "a"}],
                                                   max_tokens=2).id
    foreign = _client(server, other).chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "a"}], max_tokens=2).id
    before = elog.counts()
    key = server.key_file.read_text().strip()
    url = server.base_url
    ok_body = {"model": "flywheel", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def post(path, body, k=key, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {k}"} if k else {})}
        return httpx.post(url + path, content=data, headers=h, timeout=30)

    cases = {
        "malformed json": (post("/chat/completions", None, raw=b'{"model": "flywheel", "messages": [}'), 400),
        "not an object": (post("/chat/completions", [1, 2]), 400),
        "over the server limit": (post("/chat/completions", None, raw=b" " * (2 << 20)), 413),
        "over the key's limit": (post("/chat/completions", {**ok_body, "pad": "x" * 8000}, k=small), 413),
        "wrong key": (post("/chat/completions", ok_body, k="fw-not-a-key"), 401),
        "no key": (post("/chat/completions", ok_body, k=None), 401),
        "unknown completion": (post("/feedback", {"completion_id": "chatcmpl-nope", "signal": "accept"}), 404),
        "foreign completion": (post("/feedback", {"completion_id": foreign, "signal": "accept"}), 404),
        "unknown signal": (post("/feedback", {"completion_id": mine, "signal": "love"}), 400),
        "unknown field": (post("/feedback", {"completion_id": mine, "signal": "accept", "reward": 9}), 400),
        "feedback json": (post("/feedback", None, raw=b"accept"), 400),
        "bad tools": (post("/chat/completions", {**ok_body, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "color"}}}}}]}), 400),
        "prompt too long": (post("/chat/completions", {**ok_body, "messages": [
            {"role": "user", "content": " x" * 3000}]}), 400),
    }
    for name, (resp, status) in cases.items():
        assert resp.status_code == status, (name, resp.status_code, resp.text)
        err = resp.json()["error"]
        assert err["message"] and err["type"], name
    # the small key: two requests a minute (the refused 413 above was one of them); the third gets a Retry-After
    first, third = (post("/feedback", {"completion_id": "x", "signal": "accept"}, k=small) for _ in range(2))
    assert first.status_code == 404 and third.status_code == 429 and int(third.headers["Retry-After"]) >= 1
    assert elog.counts() == before


def test_a_revoked_key_is_refused_within_the_recheck_time(server):
    elog = EventLog(server.run_dir / "online.db")
    key, rec = new_key("leaver", 600, 1 << 16)
    elog.add_key(rec)
    client = _client(server, key)
    client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    out = subprocess.run([sys.executable, "-m", "flywheel.cli", "keys", "revoke", rec.key_id, "--db",
                          str(server.run_dir / "online.db")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"revoked {rec.key_id}" in out.stdout, out.stderr
    time.sleep(0.6)  # key_recheck_s = 0.5: the server read the key less than that ago
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    _client(server).models.list()  # other keys are unaffected


def test_deploys_and_rollbacks_reach_the_server_through_the_store_without_dropping_requests(server, policy_dir):
    elog = EventLog(server.run_dir / "online.db")
    model = load_model(policy_dir)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with Publisher(str(server.run_dir / "weights")) as pub:
        for v in (1, 2):
            for t in state.values():
                if t.is_floating_point():
                    t.add_(torch.randn_like(t) * 1e-3)
            pub.publish(v, state).result()
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.key_file.read_text().strip(), max_retries=0)

    async def load(stop):
        seen = []
        while not stop.is_set():
            r = await client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "x"}],
                                                     max_tokens=3)
            seen.append(r.model_extra["weight_version"])
        return seen

    async def drive():
        stop = asyncio.Event()
        workers = [asyncio.ensure_future(load(stop)) for _ in range(3)]
        for v in (1, 2):
            elog.append_event("deploy", v, f"test deploy {v}")
            await _until(lambda v=v: server.status(server.key_file.read_text().strip())["weight_version"] == v)
        out = subprocess.run([sys.executable, "-m", "flywheel.cli", "deploy", "rollback", "--db",
                              str(server.run_dir / "online.db"), "--reason", "test says so"],
                             capture_output=True, text=True, check=True)
        assert "rollback to version 1" in out.stdout
        await _until(lambda: server.status(server.key_file.read_text().strip())["weight_version"] == 1)
        await asyncio.sleep(0.3)
        stop.set()
        return [v for w in await asyncio.gather(*workers) for v in w]  # any failed request raises here

    seen = asyncio.run(drive())
    assert {0, 1, 2} <= set(seen) and seen[-1] == 1
    status = subprocess.run([sys.executable, "-m", "flywheel.cli", "deploy", "status", "--db",
                             str(server.run_dir / "online.db")], capture_output=True, text=True, check=True).stdout
    assert "manual: test says so" in status and "deployed: version 1" in status
    (rb,) = elog.events(("rollback",))
    assert rb.version == 1 and rb.data["from_version"] == 2


async def _until(pred, timeout_s=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(pred):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_kill_9_mid_stream_loses_nothing_acknowledged(policy_dir, tmp_path):
    srv = ServerProcess(tmp_path / "run", policy_dir, SERVE_ONLY)
    key = srv.key_file.read_text().strip()
    acked_completions, acked_feedback = [], []

    async def worker(client, stop):
        while not stop.is_set():
            try:
                r = await client.chat.completions.create(model="flywheel", max_tokens=4,
                                                         messages=[{"role": "user", "content": "go"}])
                acked_completions.append(r.id)
                fb = await client.post("/feedback", body={"completion_id": r.id, "signal": "reject"},
                                       cast_to=httpx.Response)
                acked_feedback.append(fb.json()["id"])
            except (openai.OpenAIError, httpx.HTTPError):
                return

    async def drive():
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
        stop = asyncio.Event()
        workers = [asyncio.ensure_future(worker(client, stop)) for _ in range(4)]
        while len(acked_feedback) < 12:
            await asyncio.sleep(0.05)
        stream = await client.chat.completions.create(model="flywheel", max_tokens=250, stream=True,
                                                      messages=[{"role": "user", "content": "a long one"}])
        first = await stream.__anext__()
        os.kill(srv.proc.pid, signal.SIGKILL)  # mid-stream, with four clients mid-request
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            async for _ in stream:
                pass
        stop.set()
        await asyncio.gather(*workers)
        return first.id

    streamed_id = asyncio.run(drive())
    srv.proc.wait()
    assert srv.proc.returncode == -signal.SIGKILL
    elog = EventLog(srv.run_dir / "online.db")
    stored = {c.id for c in elog.completions()}
    assert set(acked_completions) <= stored and len(acked_completions) >= 12
    assert set(acked_feedback) <= {f.id for f, _ in elog.feedback_after(0)}
    assert streamed_id not in stored  # never acknowledged: no [DONE] reached the client
    # a restart serves again from the same log: the key, the completions and their owners survived
    srv2 = ServerProcess(srv.run_dir, policy_dir, SERVE_ONLY)
    try:
        c = _client(srv2, key)
        fb = c.post("/feedback", body={"completion_id": acked_completions[0], "signal": "accept"},
                    cast_to=httpx.Response)
        assert fb.json()["completion_id"] == acked_completions[0]
        assert isinstance(elog.completion(acked_completions[-1]), CompletionRecord)
    finally:
        srv2.kill()
