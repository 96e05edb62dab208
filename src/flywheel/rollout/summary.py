"""Self-summarization's pure parts: checking a sampled summary, and the rule-based summary reward.

    note, problem = check_summary(parsed, num_tokens, max_tokens, cut)   # text for the rebuilt context, or a problem
    facts = session_facts(task, calls)                                 # file names, failing tests, edits made
    score = fact_recall(summary_text, facts)                           # share of the facts kept, 0..1

Why a checker: a summary is sampled by the policy, so it can be anything. An empty one, one cut at the token
limit, one past `rollout.summary_max_tokens` or one that calls tools must not crash the session or quietly lose
the context: the rebuilt context then carries what could be kept and a note saying what was wrong, which the
model can act on (view the files again, run the tests). Tool calls inside a summary are never run.

Why a rule-based reward (`rollout.summary_reward_weight`, off by default): the outcome reward trains the summary
only through what happens after it, a weak signal for a tiny policy. The facts a continuation needs are known to
the loop: the files the session looked at or edited (from its own tool calls), the edits made (their new text)
and the tests the task names. The score is the share of them that appear verbatim in the summary; the agent loop
adds `weight * mean score over the session's summaries` to the outcome reward (`Reward.components["summary"]`).
"""

from __future__ import annotations

from typing import Any

from flywheel.types import Task, ToolCall

EMPTY_NOTE = ("(Your summary was empty: nothing of your earlier work was kept. View the files and run the tests "
              "to see where the task stands.)")
CUT_NOTE = "(Your summary was cut at {n} tokens; what follows is its start.)"
CALLS_NOTE = "(Tool calls in a summary are not run; {n} were dropped.)"
PATH_TOOLS = ("view", "str_replace", "write", "create", "run_tests")


def check_summary(content: str, num_tool_calls: int, num_tokens: int, max_tokens: int, cut: bool,
                  encode, decode) -> tuple[str, str | None]:
    """(text of the summary as the rebuilt context shows it, the problem found or None).

    `content` is the summary turn's text without its tool calls, `num_tool_calls` how many it held (well-formed
    or not), `cut` whether sampling stopped at the token limit instead of the end-of-turn token, `max_tokens`
    the longest summary kept whole; `encode`/`decode` cut an over-long summary on a token boundary."""
    text = content.strip()
    problems, notes = [], []
    if num_tool_calls:
        problems.append("tool_calls")
        notes.append(CALLS_NOTE.format(n=num_tool_calls))
    ids = encode(text) if text else []
    if len(ids) > max_tokens:
        text = decode(ids[:max_tokens]).strip()
        problems.append("too_long")
        notes.append(CUT_NOTE.format(n=max_tokens))
    elif cut:
        problems.append("cut")
        notes.append(CUT_NOTE.format(n=num_tokens))
    if not text:
        return EMPTY_NOTE, "+".join(problems + ["empty"])
    if not problems:
        return text, None
    return "\n".join(notes + [text]), "+".join(problems)


def session_facts(task: Task, calls: list[ToolCall]) -> list[str]:
    """What a summary should keep: every path the session's tool calls named, the new text of its edits, and the
    visible tests the task declares failing (as bare function names: `test_m.py::test_x` -> `test_x`), plus any
    facts the task generator lists in `task.meta["summary_facts"]` (long tasks: the fixes revealed so far are
    added by the caller as they appear). Order-preserving, without duplicates."""
    out: list[str] = []
    for c in calls:
        args: dict[str, Any] = c.arguments if isinstance(c.arguments, dict) else {}
        if c.name in PATH_TOOLS and isinstance(args.get("path"), str) and args["path"].strip():
            out.append(args["path"].strip())
        if c.name == "str_replace" and isinstance(args.get("new"), str) and args["new"].strip():
            out.append(args["new"].strip())
    out += [t.rsplit("::", 1)[-1] for t in task.fail_to_pass if t.split("::", 1)[0] in task.visible_tests]
    out += [str(f) for f in task.meta.get("summary_facts", []) if str(f).strip()]
    return list(dict.fromkeys(out))


def fact_recall(summary: str, facts: list[str]) -> float:
    """The share of `facts` found verbatim in `summary`; 0.0 when there is nothing to keep (a constant: no
    reward for a summary, empty or not, where no fact is known)."""
    if not facts:
        return 0.0
    return sum(1 for f in facts if f in summary) / len(facts)
