"""Mid-training data: scripted sessions through the real harness, rendered exactly as the agent loop renders."""

import random

import pytest

from flywheel.config import EnvConfig, MidtrainConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.synth import generate_tasks
from flywheel.envs.tools import tools_for
from flywheel.pipeline.transcripts import make_drills, make_transcripts, render_transcript, run_script, scripted_actions
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import default_corpus, train_tokenizer
from flywheel.types import Task

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(train_tokenizer(default_corpus(300_000), 1024), tools_for(ENV))


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(4, seed=9, split="train", difficulty="easy")


def test_scripted_kinds_grade_as_intended(tasks, tmp_path):
    rng = random.Random(0)
    for kind, want in (("oracle", 1.0), ("detour", 1.0), ("failed", 0.0)):
        with CodingEnv(ENV, tmp_path) as env:
            run_script(env, tasks[0], scripted_actions(tasks[0], kind, rng))
            assert env.grade().value == want, kind


def test_transcript_mask_covers_exactly_the_assistant_turns(chat, tasks, tmp_path):
    with CodingEnv(ENV, tmp_path) as env:
        messages = run_script(env, tasks[1], scripted_actions(tasks[1], "oracle", random.Random(0)))
    ids, mask = render_transcript(chat, messages)
    assert ids == chat.render(messages, add_generation_prompt=False)[: len(ids)]
    sampled = [t for t, m in zip(ids, mask) if m]
    assert sampled == [t for m in messages if m.role == "assistant" for t in chat.assistant_tokens(m)]


def test_make_transcripts_and_drills(chat, tasks, tmp_path):
    cfg = MidtrainConfig(num_transcripts=6, failed_fraction=0.5, imperfect_fraction=0.5, seed=1)
    examples = make_transcripts(tasks, cfg, chat, lambda: CodingEnv(ENV, tmp_path))
    assert len(examples) == 6 and all(len(i) == len(m) and 0 < sum(m) < len(m) for i, m in examples)
    drills = make_drills(tasks, 5, chat.tokenizer, seed=0)
    assert len(drills) == 5
    for ids, mask in drills:
        text = chat.tokenizer.decode(ids)
        assert "# Tools" not in text and "<tool_call>" in text and text.endswith("<|im_end|>")
        assert sum(mask) < len(ids) < 200
    with pytest.raises(ValueError, match="known `solution`"):
        make_drills([Task(id="x", problem="p")], 1, chat.tokenizer)


def test_copy_drills_quote_their_edit_and_need_no_tasks(chat):
    import json
    import re

    drills = make_drills([], 40, chat.tokenizer, seed=3, copy_fraction=1.0)
    assert len(drills) == 40 and len({tuple(ids) for ids, _ in drills}) == 40  # random, not repeated
    edits = 0
    for ids, mask in drills:
        text = chat.tokenizer.decode(ids)
        path, old, new = re.search(r"In `([^`]+)`, function `[^`]+` returns the wrong value: `([^`]+)` should be "
                                   r"`([^`]+)`", text).groups()
        call = json.loads(re.search(r"<tool_call>(.*)</tool_call>", text).group(1))
        assert call["arguments"]["path"] == path and old != new
        if call["name"] == "str_replace":
            edits += 1
            assert (call["arguments"]["old"], call["arguments"]["new"]) == (old, new)
        answer = chat.tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert answer.startswith("<tool_call>") and path in answer
    assert 20 <= edits < 40  # mostly edits, some views
