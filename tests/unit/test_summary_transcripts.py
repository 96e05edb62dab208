"""Mid-training transcripts that summarize (pipeline/summary_transcripts.py): the known fix of a long task played
through the real agent loop, sandbox and grader with summarization on; the summary request is answered with what
the session did, and every segment is one example."""

import pytest

from flywheel.config import EnvConfig, RolloutConfig
from flywheel.envs.env import CodingEnv
from flywheel.pipeline.summary_transcripts import oracle_summary, summary_transcripts
from flywheel.rollout.agent import SUMMARY_PREFIX, SUMMARY_REQUEST
from flywheel.tasks.synth import oracle_actions
from flywheel.tasks.synth.long import generate_long_tasks
from flywheel.types import Message

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def long_tasks():
    return generate_long_tasks(2, seed=3, split="train", num_files=2, pad_functions=1, kind="spread")


def test_the_summary_says_what_was_done_and_what_is_left(long_tasks):
    task = long_tasks[0]
    calls = oracle_actions(task)
    first_edit = next(i for i, c in enumerate(calls) if c.name == "str_replace")
    text = oracle_summary(task, calls[:first_edit + 1])
    edit = calls[first_edit].arguments
    assert f"Fixed {edit['path']}: `{edit['old']}` -> `{edit['new']}`." in text
    left = [f for f in task.meta["summary_facts"] if f != edit["path"]]
    assert left and f"Still to fix: {', '.join(left)}." in text
    assert oracle_summary(task, [c for c in calls if c.name == "str_replace"]).endswith("Every file is fixed; submit.")


def test_sessions_summarize_and_every_segment_is_an_example(chat, long_tasks, tmp_path):
    rollout = RolloutConfig(max_turns=10, max_new_tokens=256, max_total_tokens=4096, summarize_at=300, max_summaries=4)
    examples = summary_transcripts(long_tasks, 2, chat, lambda: CodingEnv(ENV, tmp_path), rollout, 2048)
    assert len(examples) >= 4  # each session summarized at least once: two segments or more
    request = chat.render_observation([Message("user", SUMMARY_REQUEST)])
    summaries = 0
    for ids, mask in examples:
        assert len(ids) == len(mask) and 1 in mask
        at = next((i for i in range(len(ids)) if ids[i:i + len(request)] == request), None)
        if at is None:
            continue
        summaries += 1
        answer = [t for t, m in zip(ids[at + len(request):], mask[at + len(request):]) if m]
        assert answer and ids[at + len(request):] == answer  # the summary turn ends the segment, all of it trained
        text = chat.tokenizer.decode(answer, skip_special_tokens=True)
        assert "Still to fix: " in text or "Every file is fixed" in text, text
    assert summaries >= 2
    continued = [chat.tokenizer.decode(ids, skip_special_tokens=False) for ids, _ in examples]
    assert sum(SUMMARY_PREFIX.strip() in t for t in continued) >= 2  # rebuilt contexts go on from the summary


def test_summarization_off_is_refused(chat, long_tasks, tmp_path):
    with pytest.raises(ValueError, match="summarize_at"):
        summary_transcripts(long_tasks, 1, chat, lambda: CodingEnv(ENV, tmp_path), RolloutConfig(summarize_at=0),
                            2048)
