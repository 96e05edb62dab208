"""The copy probe (pipeline/copy_probe.py): it scores the edit's arguments and nothing else.

Fake "models" stand in for the policy here, because what is tested is which positions the probe reads: one
that always predicts the true next token scores 1, one that is right everywhere except at the tool's name
(a base that gives up would say `submit` there) still scores 1, and one wrong at one argument token scores 0
exact. The probe on real mid-trained bases is in docs/benchmarks.md.
"""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from flywheel.envs.env import SYSTEM_COMPACT
from flywheel.pipeline.copy_probe import _edit_session, argument_span, copy_probe
from flywheel.pipeline.transcripts import render_transcript
from flywheel.tasks.synth import generate_tasks


class NextTokenOracle(torch.nn.Module):
    """Logits that put all mass on the true next token of one known sequence, except where told to err."""

    def __init__(self, ids: list[int], vocab: int, wrong_at: set[int] = frozenset()):
        super().__init__()
        self.ids, self.vocab, self.wrong_at = ids, vocab, wrong_at

    def forward(self, x):
        n = x.shape[1]
        logits = torch.zeros(1, n, self.vocab)
        for i in range(n):
            target = self.ids[i + 1] if i + 1 < len(self.ids) else 0
            logits[0, i, (target + 1) % self.vocab if i + 1 in self.wrong_at else target] = 1.0
        return SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def task_and_ids(chat):
    task = next(t for t in generate_tasks(8, seed=4, split="heldout", difficulty="easy") if _edit_session(t, SYSTEM_COMPACT))
    ids, mask = render_transcript(chat, _edit_session(task, SYSTEM_COMPACT))
    return task, ids, mask


def test_probe_reads_only_the_edit_arguments(chat, task_and_ids):
    task, ids, mask = task_and_ids
    start, end = argument_span(ids, mask, chat.tokenizer.decode)
    assert chat.tokenizer.decode(ids[start:end]).lstrip().startswith('{"path"')  # right after `"arguments":`
    assert task.solution and "str_replace" in chat.tokenizer.decode(ids[:start])
    vocab = len(chat.tokenizer)
    name_at = max(k for k in range(start) if "str_replace" in chat.tokenizer.decode(ids[k:start]))  # its first token
    assert chat.tokenizer.decode(ids[name_at:name_at + 1]).strip() in "str_replace"
    for wrong_at, want in [(set(), 1.0), ({name_at}, 1.0), ({start + 2}, 0.0)]:
        got = copy_probe(NextTokenOracle(ids, vocab, wrong_at), chat, SYSTEM_COMPACT, [task])
        assert got["exact"] == want and got["num_tasks"] == 1, (wrong_at, got)
    assert got["token_acc"] == pytest.approx(1 - 1 / (end - start))


def test_probe_needs_a_task_with_a_known_fix(chat):
    task = generate_tasks(1, seed=4, difficulty="easy")[0]
    with pytest.raises(ValueError, match="no task has a known view-then-edit fix"):
        copy_probe(NextTokenOracle([0], len(chat.tokenizer)), chat, SYSTEM_COMPACT, [replace(task, solution=None)])
