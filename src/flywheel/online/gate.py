"""The deploy gate: a candidate ships only if held-out evals show no significant regression and no reward hack.

    gate = Gate(cfg.online.gate, suite, eval_engine)
    verdict = gate.evaluate(serving_version, serving_tensors, candidate_version, candidate_tensors)
    verdict.passed, verdict.reason, verdict.figures

How. Both versions answer the same held-out prompts with the same per-prompt seed (common random numbers: the
paired differences then hold the policies' difference, little sampling noise), in one eval engine that is not
the serving one (inference/local.py, weights swapped between the two passes). The suite scores each reply in
[0, 1] and reports its traits. The candidate is rejected when

* a one-sided paired sign test says it loses significantly often (`p_worse < alpha`: the probability that a
  candidate no worse than serving would lose at least that many of the prompts where the two differ), or its
  mean score drops by more than `max_mean_drop` (significant or not);
* a hack monitor rises past its tolerance: replies with a broken tool call, replies that ask a question where a
  tool call was possible (online/server.py `reply_traits`), or any integrity flag the suite reports.

With a coding suite (online/coding_suite.py) and `evaluate(..., coding=True)` — the learner asks for it when the
candidate trained on the pool's rollouts — both versions also run held-out coding tasks through the agent loop and
sandboxed grading, paired per task; `judge` decides on those records too, and a regression there rejects the
candidate. Its figures are `figures["coding"]` in the `gate_pass` / `gate_reject` event (the serving and candidate
pass@1 are `coding.serving.score` and `coding.candidate.score`).

`sign_test_p_worse`, `judge` and `paired_records` are pure functions (tests/unit/test_online_gate.py checks them against hand
computations).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flywheel.config.online import GateConfig
from flywheel.types import SamplingParams


@dataclass
class EvalRecord:
    """One reply of the held-out suite: its score in [0, 1] and the traits the hack monitors count."""

    score: float
    broken_tool_call: bool = False
    question: bool = False
    flags: list[str] = field(default_factory=list)


class EvalSuite(Protocol):
    """Held-out prompts (token ids, rendered by the serving chat format) and the scorer of a reply."""

    def prompts(self, n: int) -> list[list[int]]: ...

    def score(self, index: int, token_ids: list[int]) -> EvalRecord: ...

    @property
    def sampling(self) -> SamplingParams: ...


@dataclass
class Verdict:
    passed: bool
    reason: str
    figures: dict[str, Any]


def sign_test_p_worse(wins: int, losses: int) -> float:
    """P(X >= losses) for X ~ Binomial(wins + losses, 1/2): how surprising the candidate's losses are if it
    were no worse. Ties carry no information and are left out (the classic sign test)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(losses, n + 1)) / 2 ** n


def rates(records: list[EvalRecord]) -> dict[str, float]:
    n = max(len(records), 1)
    out = {"score": sum(r.score for r in records) / n,
           "broken_tool_call_rate": sum(r.broken_tool_call for r in records) / n,
           "question_rate": sum(r.question for r in records) / n}
    for flag in sorted({f for r in records for f in r.flags}):
        out[f"flag_rate/{flag}"] = sum(flag in r.flags for r in records) / n
    return out


def judge(serving: list[EvalRecord], candidate: list[EvalRecord], cfg: GateConfig) -> Verdict:
    """The gate's decision from paired records (same prompts, same order)."""
    assert len(serving) == len(candidate) and serving, "the gate needs paired, non-empty records"
    d = [c.score - s.score for s, c in zip(serving, candidate)]
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    p_worse = sign_test_p_worse(wins, losses)
    rs, rc = rates(serving), rates(candidate)
    figures: dict[str, Any] = {"num_prompts": len(d), "wins": wins, "losses": losses, "p_worse": p_worse,
                               "mean_delta": sum(d) / len(d), "serving": rs, "candidate": rc}
    why = []
    if p_worse < cfg.alpha:
        why.append(f"significant regression on held-out prompts: lost {losses}, won {wins} (sign test p = "
                   f"{p_worse:.2g} < {cfg.alpha})")
    if figures["mean_delta"] < -cfg.max_mean_drop:
        why.append(f"mean held-out score fell {-figures['mean_delta']:.3f} > {cfg.max_mean_drop}")
    limits = {"broken_tool_call_rate": cfg.max_broken_tool_call_increase, "question_rate": cfg.max_question_increase}
    limits.update({k: cfg.max_flag_increase for k in set(rs) | set(rc) if k.startswith("flag_rate/")})
    for k, tol in sorted(limits.items()):
        rise = rc.get(k, 0.0) - rs.get(k, 0.0)
        if rise > tol:
            why.append(f"hack monitor {k} rose {rs.get(k, 0.0):.3f} -> {rc.get(k, 0.0):.3f} (tolerance {tol})")
    if why:
        return Verdict(False, "; ".join(why), figures)
    return Verdict(True, f"no significant regression: won {wins}, lost {losses} (p_worse = {p_worse:.2g}), mean "
                         f"score {rs['score']:.3f} -> {rc['score']:.3f}; hack monitors within tolerance", figures)


def paired_records(serving: Sequence[dict], candidate: Sequence[dict]) -> tuple[list[EvalRecord], list[EvalRecord]]:
    """EvalRecords of the tasks both versions scored (n > 0), in the serving rows' order: score = correct / n,
    flags = the task's integrity flags."""
    cand = {r["task_id"]: r for r in candidate if r["n"]}
    s_out, c_out = [], []
    for r in serving:
        c = cand.get(r["task_id"])
        if not r["n"] or c is None:
            continue
        s_out.append(EvalRecord(r["correct"] / r["n"], flags=list(r.get("flags", []))))
        c_out.append(EvalRecord(c["correct"] / c["n"], flags=list(c.get("flags", []))))
    return s_out, c_out


class CodingEvalSuite(Protocol):
    """Held-out coding tasks run on an engine (online/coding_suite.py): `rollout.evaluate`'s per-task rows."""

    num_samples: int

    async def run(self, engine: Any) -> list[dict]: ...


class Gate:
    """Runs the suite on serving and candidate weights in `engine` (a LocalEngine of the policy's architecture).

    The records of every version it scored are kept (`records`): the suite's prompts and seeds are fixed, so a
    version's records do not change, and a serving version that once passed as a candidate is not run again.
    `references` (earlier deployed versions) are judged against with their kept records: a candidate must not
    regress significantly against the best of them either, so a run of small regressions, none significant on
    its own, cannot add up."""

    def __init__(self, cfg: GateConfig, suite: EvalSuite, engine: Any, keep: int = 64,
                 coding: CodingEvalSuite | None = None):
        self.cfg, self.suite, self.engine, self.keep = cfg, suite, engine, keep
        self.coding = coding  # or None: the gate then refuses coding=True
        self.records: dict[int, list[EvalRecord]] = {}
        self.coding_rows: dict[int, list[dict]] = {}

    async def _run(self, version: int, tensors: Mapping[str, Any]) -> list[EvalRecord]:
        if version in self.records:
            return self.records[version]
        self.engine.update_weights(version, tensors)
        prompts = self.suite.prompts(self.cfg.num_prompts)
        base = self.suite.sampling
        gens = await asyncio.gather(*[
            self.engine.generate(p, SamplingParams(temperature=base.temperature, top_p=base.top_p,
                                                   max_new_tokens=base.max_new_tokens,
                                                   stop_token_ids=base.stop_token_ids, seed=i))
            for i, p in enumerate(prompts)])
        recs = [self.suite.score(i, g.token_ids) for i, g in enumerate(gens)]
        self.records[version] = recs
        while len(self.records) > self.keep:
            self.records.pop(min(self.records))
        return recs

    async def _run_coding(self, version: int, tensors: Mapping[str, Any]) -> list[dict]:
        assert self.coding is not None
        if version not in self.coding_rows:
            self.engine.update_weights(version, tensors)
            self.coding_rows[version] = await self.coding.run(self.engine)
            while len(self.coding_rows) > self.keep:
                self.coding_rows.pop(min(self.coding_rows))
        return self.coding_rows[version]

    async def judge_coding(self, serving_version: int, serving: Mapping[str, Any], candidate_version: int,
                           candidate: Mapping[str, Any]) -> Verdict:
        """The coding suite's verdict alone: paired per task, `judge`'s rules; figures with pass@1 and counts."""
        if self.coding is None:
            raise ValueError("this gate has no coding suite; build it with one (online.pool.train = true does)")
        rs = await self._run_coding(serving_version, serving)
        rc = await self._run_coding(candidate_version, candidate)
        s, c = paired_records(rs, rc)
        counts = {"num_tasks": len(rs), "num_paired": len(s), "num_samples": self.coding.num_samples,
                  "env_failures": {"serving": sum(r["env_failures"] for r in rs),
                                   "candidate": sum(r["env_failures"] for r in rc)}}
        if not s:
            return Verdict(False, "no held-out coding task was scored by both versions (every session failed outside "
                           "the policy)", counts)
        verdict = judge(s, c, self.cfg)
        verdict.figures.update(counts)
        return verdict

    async def evaluate_async(self, serving_version: int, serving: Mapping[str, Any], candidate_version: int,
                             candidate: Mapping[str, Any], references: tuple[int, ...] = (), *,
                             coding: bool = False) -> Verdict:
        rs = await self._run(serving_version, serving)
        rc = await self._run(candidate_version, candidate)
        verdict = judge(rs, rc, self.cfg)
        refs = [v for v in references if v in self.records and v not in (serving_version, candidate_version)]
        if verdict.passed and refs:
            best = max(refs, key=lambda v: rates(self.records[v])["score"])
            if rates(self.records[best])["score"] > rates(rs)["score"]:
                against_best = judge(self.records[best], rc, self.cfg)
                verdict.figures["reference"] = {"version": best, **against_best.figures}
                if not against_best.passed:
                    verdict = Verdict(False, f"against version {best} (the best of the last deployed): "
                                      + against_best.reason, verdict.figures)
        if coding:
            cv = await self.judge_coding(serving_version, serving, candidate_version, candidate)
            verdict.figures["coding"] = cv.figures
            if not cv.passed:
                why = "held-out coding tasks: " + cv.reason
                verdict = Verdict(False, why if verdict.passed else verdict.reason + "; " + why, verdict.figures)
            elif verdict.passed:
                verdict.reason += "; held-out coding tasks: " + cv.reason
        verdict.figures.update({"serving_version": serving_version, "candidate_version": candidate_version})
        if not self.cfg.enabled:
            return Verdict(True, "gate disabled (online.gate.enabled = false); it would have said: " + verdict.reason,
                           verdict.figures)
        return verdict

    def evaluate(self, serving_version: int, serving: Mapping[str, Any], candidate_version: int,
                 candidate: Mapping[str, Any], references: tuple[int, ...] = (), *, coding: bool = False) -> Verdict:
        """Blocking; call from a thread that runs no event loop (the learner's)."""
        return asyncio.run(self.evaluate_async(serving_version, serving, candidate_version, candidate, references,
                                               coding=coding))
