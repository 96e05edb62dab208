"""Copy probe: how often a policy writes a held-out task's known edit, token for token, when shown the session
that leads up to it.

    result = copy_probe(model, chat, system_prompt(cfg.env), heldout)   # {"exact": 0.46, "token_acc": 0.91, ...}

Why: whether the `tiny` policy learned in mid-training to copy the statement's span into its `str_replace`
call decides most of what RL can do with it. On the three demo bases the probe read 0.14, 0.45 and 0.43
where greedy held-out pass@1 was 0.14, 0.45 and 0.43; on the give-up bases, those whose attempts succeeded
28–29 % of the time probed at 0.39–0.46, those at 6–10 % at 0.14–0.20 (docs/benchmarks.md). A held-out
evaluation samples hundreds of sessions in sandboxes (15–75 s here); this probe is one teacher-forced
forward per task (6–10 s for the demo's 100 tasks, model loading included, on this machine while it ran
other jobs), so mid-training experiments can read it before any RL. The job writes it to `summary.json` as
`copy_probe_base`.

How: for each task with a known fix, the session is rendered exactly as the agent loop would (system prompt
and tools, the statement, the `view` call, the numbered file), followed by the oracle edit call. The probe
takes the model's argmax at every position of that call's *arguments* (from `"arguments"` on: the tool's
name is a decision, not a copy; a base that gives up picks `submit` there) and reports the share of tasks
where every argument token matched (`exact`) and the share of matching tokens (`token_acc`).
"""

from __future__ import annotations

import torch

from flywheel.pipeline.transcripts import fix_turns, render_transcript
from flywheel.types import Message, Task


def _edit_session(task: Task, system: str) -> list[Message] | None:
    """The messages up to and including the oracle's first edit, or None when the task has no view-then-edit fix."""
    turns = fix_turns(task) if task.solution else None
    return [Message(role="system", content=system), *turns[:4]] if turns else None  # statement, view, file, edit


def argument_span(ids: list[int], mask: list[int], decode) -> tuple[int, int]:
    """[start, end) of the last assistant turn's tokens from the one that completes `"arguments"` on."""
    end = max(i for i, m in enumerate(mask) if m) + 1
    start = end - 1
    while start > 0 and mask[start - 1]:
        start -= 1
    for k in range(start, end):
        if '"arguments"' in decode(ids[start:k + 1]):
            return k + 1, end
    raise ValueError("the edit turn has no \"arguments\": not a tool call")


def copy_probe(model, chat, system: str, tasks: list[Task]) -> dict[str, float]:
    """Teacher-forced argmax accuracy of `model` on the arguments of each task's known edit (see module doc)."""
    exact = correct = total = probed = 0
    was_training = model.training
    model.eval()
    try:
        for task in tasks:
            messages = _edit_session(task, system)
            if messages is None:
                continue
            ids, mask = render_transcript(chat, messages)
            start, end = argument_span(ids, mask, chat.tokenizer.decode)
            with torch.no_grad():
                logits = model(torch.tensor([ids[:end]])).logits[0]
            predicted = logits[start - 1:end - 1].argmax(-1).tolist()
            hits = sum(p == t for p, t in zip(predicted, ids[start:end]))
            exact += hits == end - start
            correct += hits
            total += end - start
            probed += 1
    finally:
        model.train(was_training)
    if probed == 0:
        raise ValueError("copy probe: no task has a known view-then-edit fix (tasks need `solution`)")
    return {"exact": exact / probed, "token_acc": correct / total, "num_tasks": float(probed)}
