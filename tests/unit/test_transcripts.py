"""Mid-training data: scripted sessions through the real harness, rendered exactly as the agent loop renders."""

import random
import re

import pytest

from flywheel.config import EnvConfig, MidtrainConfig
from flywheel.envs.env import CodingEnv
from flywheel.pipeline.transcripts import (
    make_drills,
    make_transcripts,
    render_transcript,
    run_script,
    scripted_actions,
)
from flywheel.policy.chat import ChatFormat
from flywheel.tasks.synth import generate_tasks
from flywheel.types import Task

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(4, seed=9, split="train", difficulty="easy")


def test_scripted_kinds_grade_as_intended(tasks, tmp_path):
    rng = random.Random(0)
    for kind, want in (("oracle", 1.0), ("detour", 1.0), ("failed", 0.0)):
        with CodingEnv(ENV, tmp_path) as env:
            run_script(env, tasks[0], scripted_actions(tasks[0], kind, rng))
            assert env.grade().value == want, kind


@pytest.mark.parametrize("share, edits", [(1.0, 0), (0.0, 1)])
def test_failed_giveup_share_picks_how_a_failed_session_fails(tasks, share, edits):
    for seed in range(5):
        calls = scripted_actions(tasks[0], "failed", random.Random(seed), giveup_share=share)
        assert [c.name for c in calls].count("str_replace") == edits and calls[-1].name == "submit"


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
    bare = ChatFormat(chat.tokenizer, [])
    drills = make_drills(tasks, 5, bare, seed=0)
    assert len(drills) == 5
    for ids, mask in drills:
        text = bare.tokenizer.decode(ids)
        assert "# Tools" not in text and "<tool_call>" in text and text.endswith("<|im_end|>")
        assert sum(mask) < len(ids) < 300
    with pytest.raises(ValueError, match="known `solution`"):
        make_drills([Task(id="x", problem="p")], 1, bare)


def test_one_seed_gives_one_corpus(chat, tasks, tmp_path):
    """No wall time or path of the run reaches the observations the model reads (detours run the tests)."""
    cfg = MidtrainConfig(num_transcripts=12, failed_fraction=0.0, imperfect_fraction=1.0, seed=2)
    examples = make_transcripts(tasks, cfg, chat, lambda: CodingEnv(ENV, tmp_path / "a"))
    texts = [chat.tokenizer.decode(ids) for ids, _ in examples]
    assert any("passed" in t for t in texts) and not any(re.search(r"(passed|failed) in \d", t) for t in texts)
    assert make_transcripts(tasks, cfg, chat, lambda: CodingEnv(ENV, tmp_path / "b")) == examples


def test_drills_in_session_context_are_packed_after_one_system_prompt(chat, tasks):
    drills = make_drills(tasks, 7, chat, seed=1, copy_fraction=0.5, system="Fix the bug.", per_sequence=3)
    assert len(drills) == 3  # 3 + 3 + 1 episodes
    for ids, mask in drills:
        text = chat.tokenizer.decode(ids)
        assert text.count("# Tools") == 1 and text.count("Fix the bug.") == 1 and text.endswith("<|im_end|>")
        trained = chat.tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert trained.count("<tool_call>") == text.count("<tool_call>")  # every call is trained ...
        assert "returns the wrong value" not in trained and "# Tools" not in trained  # ... and nothing else
    with pytest.raises(ValueError, match="per_sequence"):
        make_drills(tasks, 1, chat, per_sequence=0)


def test_copy_drills_quote_their_edit_and_need_no_tasks(chat):
    import json
    import re

    bare = ChatFormat(chat.tokenizer, [])
    drills = make_drills([], 40, bare, seed=3, copy_fraction=1.0)
    assert len(drills) == 40 and len({tuple(ids) for ids, _ in drills}) == 40  # random, not repeated
    edits = 0
    for ids, mask in drills:
        text = bare.tokenizer.decode(ids)
        path, old, new = re.search(r"In `([^`]+)`, function `[^`]+` returns the wrong value: `([^`]+)` should be "
                                   r"`([^`]+)`", text).groups()
        calls = [json.loads(c) for c in re.findall(r"<tool_call>(.*?)</tool_call>", text)]
        assert all(c["arguments"]["path"] == path for c in calls) and old != new
        for c in calls:
            if c["name"] == "str_replace":
                edits += 1
                assert (c["arguments"]["old"], c["arguments"]["new"]) == (old, new)
        if [c["name"] for c in calls] == ["view", "str_replace"]:
            assert f"\treturn {old}" in text or f"    return {old}" in text  # the viewed file holds the old text
        answer = bare.tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert answer.startswith("<tool_call>") and path in answer
    assert 20 <= edits < 40  # mostly edits, some views only
