"""The vLLM client's reading of vLLM's answers (inference/vllm.py `VLLMEngine.parse`, `routed_experts`).

    .venv/bin/python -m pytest -q tests/unit/test_vllm_client.py

Answers are written here in the shape vLLM 0.32's `/inference/v1/generate` returns (checked against the real
server in tests/integration/test_vllm.py); no server is started.
"""

import base64
import io

import numpy as np
import pytest

from flywheel.config import InferenceConfig
from flywheel.inference.vllm import VLLMEngine, VLLMError, routed_experts
from flywheel.types import SamplingParams


def engine():
    return VLLMEngine(InferenceConfig(type="vllm", vllm={"url": "http://127.0.0.1:9"}), max_seq_len=64)


def answer(tokens, spans, finish="length", experts=None):
    return {"choices": [{"token_ids": tokens, "finish_reason": finish, "routed_experts": experts,
                         "weight_versions": [{"version": v, "start": s, "end": e} for v, s, e in spans],
                         "logprobs": {"content": [{"token_id": t, "logprob": -0.5 - i} for i, t in enumerate(tokens)]}}]}


def test_versions_follow_vllms_spans():
    g = engine().parse(answer([5, 6, 7, 8], [("3", 0, 1), ("4", 1, 4)], finish="stop"), prompt_len=9, wall_s=0.1)
    assert g.token_ids == [5, 6, 7, 8] and g.versions == [3, 4, 4, 4] and g.finish_reason == "stop"
    assert g.logprobs == [-0.5, -1.5, -2.5, -3.5] and g.prompt_len == 9 and g.routed_experts is None
    assert engine().parse(answer([1], [("0", 0, 1)], finish="abort"), 1, 0.0).finish_reason == "aborted"


def test_unlabelled_or_foreign_versions_are_refused():
    with pytest.raises(VLLMError, match="not a flywheel version"):
        engine().parse(answer([1, 2], [("default", 0, 2)]), 1, 0.0)
    with pytest.raises(VLLMError, match="no weight_versions"):
        engine().parse(answer([1, 2], []), 1, 0.0)


def test_routed_experts_are_those_of_the_forward_that_produced_each_token():
    # vLLM: one row per forwarded position (prompt 3 + 2 generated - 1 = 4 rows), [layers=2, k=2]
    arr = np.arange(4 * 2 * 2, dtype=np.uint16).reshape(4, 2, 2)
    buf = io.BytesIO()
    np.save(buf, arr)
    got = routed_experts(base64.b64encode(buf.getvalue()).decode(), prompt_len=3, num_tokens=2)
    assert got == arr[2:4].tolist()  # token 0 from the last prompt position, token 1 from the next


def test_request_body_is_token_ids_and_checks_the_context():
    body = engine().request_body([1, 2, 3], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=100, seed=4,
                                                           stop=["</tool_call>"], stop_token_ids=[9]))
    sp = body["sampling_params"]
    assert body["token_ids"] == [1, 2, 3] and body["output_mode"] == "tokens"
    assert sp["max_tokens"] == 61 and sp["seed"] == 4 and sp["logprobs"] == 0  # clamped to the context of 64
    assert sp["stop"] == ["</tool_call>"] and sp["include_stop_str_in_output"] and sp["stop_token_ids"] == [9]
    with pytest.raises(ValueError, match="does not fit the context"):
        engine().request_body(list(range(64)), SamplingParams())
    with pytest.raises(ValueError, match="non-empty"):
        engine().request_body([], SamplingParams())
