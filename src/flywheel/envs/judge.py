"""The rubric judge: an LLM scores an agent's work on weighted criteria, mixed with the test reward.

    judge = RubricJudge(engine, ChatFormat(tokenizer), [("correct", 2.0, "the fix is right"),
                                                       ("minimal", 1.0, "no unrelated changes")])
    score = await judge.score(task, diff=workspace_diff(task, ws))
    reward = combine(test_reward, score, cfg.env)      # test_weight * tests + rubric_weight * score + penalty

Why a separate module: the judge is a policy of its own (any flywheel Engine), while envs/reward.py decides
what the hidden tests say; `env.rubric_weight = 0` (the default) leaves the judge out entirely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flywheel.config import EnvConfig
from flywheel.types import Message, Reward, SamplingParams, Task

JUDGE_SYSTEM = ("You grade the work of a coding agent. For each criterion give a score from 0 (bad) to 10 "
                "(excellent). Reply with exactly one line per criterion: `<name>: <score>`.")


def parse_scores(text: str, names: list[str]) -> dict[str, float]:
    """`name: 7` lines (or a JSON-ish `"name": 7`) -> {name: 0.7}; criteria not found are absent."""
    out: dict[str, float] = {}
    for name in names:
        m = re.search(rf"{re.escape(name)}[\"'*]*\s*[:=]?\s*(-?\d+(?:\.\d+)?)", text, re.IGNORECASE)
        if m:
            out[name] = min(max(float(m.group(1)), 0.0), 10.0) / 10.0
    return out


@dataclass
class RubricScore:
    value: float  # weighted mean in [0, 1]; a criterion the judge did not score counts 0
    scores: dict[str, float]
    text: str
    num_missing: int


class RubricJudge:
    """An LLM judge over weighted criteria, through any flywheel `Engine` and `ChatFormat`.

        judge = RubricJudge(engine, ChatFormat(tokenizer), [("correct", 2.0, "the fix is right"),
                                                           ("minimal", 1.0, "no unrelated changes")])
        score = await judge.score(task, diff=workspace_diff(task, ws))
        reward = combine(test_reward, score, cfg.env)
    """

    def __init__(self, engine: Any, chat_format: Any, criteria: list[tuple[str, float, str]], *,
                 max_new_tokens: int = 96, temperature: float = 0.0) -> None:
        if not criteria:
            raise ValueError("a rubric needs at least one (name, weight, description) criterion")
        for c in criteria:
            if not (isinstance(c, (tuple, list)) and len(c) == 3 and isinstance(c[0], str) and c[0].strip()
                    and isinstance(c[1], (int, float)) and c[1] >= 0 and isinstance(c[2], str)):
                raise ValueError(f"rubric criterion {c!r} must be (name: str, weight >= 0, description: str)")
        if sum(c[1] for c in criteria) <= 0:
            raise ValueError("rubric weights must not all be 0")
        self.engine, self.chat = engine, chat_format
        self.criteria = [(str(n), float(w), str(d)) for n, w, d in criteria]
        self.sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                       stop_token_ids=list(getattr(chat_format, "stop_token_ids", [])))

    def messages(self, task: Task, diff: str = "", transcript: str = "") -> list[Message]:
        crit = "\n".join(f"- {n} (weight {w:g}): {d}" for n, w, d in self.criteria)
        user = f"Task:\n{task.problem}\n\nChanges:\n{diff or '(none)'}\n"
        if transcript:
            user += f"\nTranscript:\n{transcript[-4000:]}\n"
        user += f"\nCriteria:\n{crit}"
        return [Message("system", JUDGE_SYSTEM), Message("user", user)]

    async def score(self, task: Task, diff: str = "", transcript: str = "") -> RubricScore:
        ids = self.chat.render(self.messages(task, diff, transcript))
        gen = await self.engine.generate(ids, self.sampling)
        text = self.chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        names = [n for n, _, _ in self.criteria]
        scores = parse_scores(text, names)
        total_w = sum(w for _, w, _ in self.criteria)
        value = sum(w * scores.get(n, 0.0) for n, w, _ in self.criteria) / total_w
        return RubricScore(value=value, scores=scores, text=text, num_missing=len(names) - len(scores))


def combine(reward: Reward, rubric: RubricScore | float, cfg: EnvConfig) -> Reward:
    """Test reward and rubric mixed by `test_weight` / `rubric_weight`; the penalty is kept as is."""
    r = rubric.value if isinstance(rubric, RubricScore) else float(rubric)
    tests = reward.components.get("tests", 0.0)
    penalty = reward.components.get("penalty", 0.0)
    comps = dict(reward.components, rubric=r)
    return Reward(value=cfg.test_weight * tests + cfg.rubric_weight * r + penalty, components=comps,
                  flags=list(reward.flags), tests=dict(reward.tests), notes=list(reward.notes))
