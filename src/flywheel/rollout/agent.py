"""The agent loop: one multi-turn session, engine ⇄ environment, recorded token-exactly.

    traj = await run_session(engine, chat, env, task, cfg, group_id="t1/0", seed=7)

Why token-exact: the trainer must score exactly the tokens the sampler produced, so the context is rendered
once and only ever appended to. Sampled tokens are kept as sampled (loss mask 1, with the sampler's log-probs,
weight versions and routed experts); tool observations are tokenized and appended with loss mask 0 — nothing
is re-tokenized. A malformed tool call becomes an error observation, never the end of the session.

Self-summarization: when the context passes `cfg.summarize_at` tokens, the model is asked to summarize its
work; that summary is sampled (and so trained, sharing the trajectory's reward), the context is rebuilt from
(system, task, summary) and the session goes on in a new segment. At most `cfg.max_summaries` per session; a
summary that is empty, too long, cut or holds tool calls is kept as far as it can be, with a note the model can
act on (rollout/summary.py), never a crash. `meta["summaries"]` records each one (context tokens before and
after, the problem found, the share of the session's facts it kept); with `cfg.summary_reward_weight` that share
is added to the outcome reward.

A session ends at submit, when the model answers without a tool call, at `max_turns`, at the token budget
`max_total_tokens` (all segments together) or at the wall-clock limit. Failures outside the policy (the
sandbox or the engine broke) raise `EnvironmentFailure`; the worker records and retries them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

from flywheel.config import RolloutConfig
from flywheel.rollout.summary import check_summary, fact_recall, session_facts
from flywheel.types import Generation, Message, SamplingParams, Segment, Task, ToolCall, Trajectory

SUMMARY_REQUEST = (
    "Your context is almost full. Summarize your progress so far: what the task is, what you found, what you "
    "changed and what is left to do. Do not call tools in this message.")
SUMMARY_PREFIX = "Summary of your earlier work on this task:\n"
ENGINE_GRACE_S = 60.0  # how long past the session's deadline an unanswered engine request is waited for


class EnvironmentFailure(RuntimeError):
    """The session broke for a reason outside the policy (sandbox, grader or engine error)."""


class SandboxStartFailure(EnvironmentFailure):
    """The session's sandbox (or its task workspace) could not be started: `env.reset` failed."""


class _ContextFull(Exception):
    """The engine refused to extend the context (it is at the model's limit): the session ends there."""


@dataclass
class _SegmentBuilder:
    """Accumulates one context window; `append` keeps the five per-token lists aligned."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routed: list[list[list[int]]] | None = None

    def observe(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        if self.routed is not None:
            self.routed += [[] for _ in ids]

    def sample(self, gen: Generation) -> None:
        n = len(gen.token_ids)
        assert len(gen.logprobs) == n and len(gen.versions) == n
        if gen.routed_experts is not None and self.routed is None:
            self.routed = [[] for _ in self.token_ids]
        self.token_ids += gen.token_ids
        self.loss_mask += [1] * n
        self.logprobs += list(gen.logprobs)
        self.versions += list(gen.versions)
        if self.routed is not None:
            self.routed += gen.routed_experts if gen.routed_experts is not None else [[] for _ in range(n)]

    def build(self) -> Segment:
        return Segment(self.token_ids, self.loss_mask, self.logprobs, self.versions, self.routed)


def _task_messages(messages: list[Message]) -> list[Message]:
    """The (system, task) head of a conversation, kept when the context is rebuilt after a summary."""
    head = [m for m in messages if m.role == "system"][:1]
    users = [m for m in messages if m.role == "user"][:1]
    return head + users


async def run_session(engine, chat, env, task: Task, cfg: RolloutConfig, *, group_id: str = "",
                      seed: int | None = None) -> Trajectory:
    """Run one session of `task` to its end and grade it. See the module docstring."""
    t_start = time.monotonic()
    traj = Trajectory(task_id=task.id, group_id=group_id)
    timings = {"generate_s": 0.0, "env_s": 0.0, "grade_s": 0.0}
    stop_ids = list(chat.stop_token_ids)
    end_of_turn = stop_ids[0]
    seg = _SegmentBuilder()
    head: list[Message] = []
    total_sampled = 0
    summaries: list[dict] = []  # one record per summary (see the module docstring)
    calls: list[ToolCall] = []  # every usable tool call of the session, for the summary's facts
    max_summary_tokens = cfg.summary_max_tokens or max(1, cfg.summarize_at // 2)
    turns_in_segment = 0
    done = False
    deadline = t_start + min(cfg.wall_clock_s, task.limits.timeout_s or cfg.wall_clock_s)
    max_turns = task.limits.max_turns or cfg.max_turns

    async def generate(max_new: int, turn: int) -> tuple[Generation, str]:
        nonlocal total_sampled
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new,
                                  stop_token_ids=stop_ids, seed=None if seed is None else seed * 1009 + turn)
        t0 = time.monotonic()
        try:
            # A request the engine never answers (a bug, a dead engine) must not hold the session forever:
            # past the session's deadline and a grace period it is an engine failure (retried elsewhere).
            gen = await asyncio.wait_for(engine.generate(list(seg.token_ids), sampling),
                                         max(0.0, deadline - time.monotonic()) + ENGINE_GRACE_S)
        except ValueError as err:  # the engine refuses the request: the context is full
            raise _ContextFull(str(err)) from err
        except Exception as err:
            raise EnvironmentFailure(f"engine failed: {err}") from err
        timings["generate_s"] += time.monotonic() - t0
        seg.sample(gen)
        total_sampled += len(gen.token_ids)
        if not gen.token_ids or gen.token_ids[-1] not in stop_ids:
            seg.observe([end_of_turn])  # close a turn cut by max tokens; not sampled, so mask 0
        return gen, chat.tokenizer.decode(gen.token_ids, skip_special_tokens=False)

    try:
        t0 = time.monotonic()
        try:
            messages = await asyncio.to_thread(env.reset, task)
        except Exception as err:  # the sandbox or the task broke before the policy acted
            raise SandboxStartFailure(f"reset failed for task {task.id}: {err}") from err
        timings["sandbox_start_s"] = time.monotonic() - t0  # reset: the sandbox and its workspace (base cached)
        timings["env_s"] += timings["sandbox_start_s"]
        head = _task_messages(messages)
        seg.observe(chat.render(messages))
        while traj.num_turns < max_turns:
            budget = cfg.max_total_tokens - total_sampled
            if budget <= 0 or time.monotonic() > deadline:
                break
            if (cfg.summarize_at and len(seg.token_ids) > cfg.summarize_at and turns_in_segment > 0
                    and len(summaries) < cfg.max_summaries):
                seg.observe(chat.render_observation([Message(role="user", content=SUMMARY_REQUEST)]))
                try:
                    gen, text = await generate(min(cfg.max_new_tokens, budget), 10_000 + len(summaries))
                except _ContextFull as err:  # no room left even for the summary: the session ends here
                    traj.meta["context_full"] = str(err)
                    break
                parsed = chat.parse(text)
                cut = not gen.token_ids or gen.token_ids[-1] not in stop_ids
                summary, problem = check_summary(parsed.content, len(parsed.tool_calls) + len(parsed.errors),
                                                 len(gen.token_ids), max_summary_tokens, cut,
                                                 chat.encode_text, chat.tokenizer.decode)
                before = len(seg.token_ids)
                traj.segments.append(seg.build())
                seg = _SegmentBuilder()
                seg.observe(chat.render(head + [Message(role="user", content=SUMMARY_PREFIX + summary)]))
                summaries.append({"tokens_before": before, "tokens_after": len(seg.token_ids), "problem": problem,
                                  "facts_kept": fact_recall(summary, session_facts(task, calls))})
                turns_in_segment = 0  # a rebuilt context longer than summarize_at must not summarize again at once
                continue
            try:
                _, text = await generate(min(cfg.max_new_tokens, budget), traj.num_turns)
            except _ContextFull as err:
                traj.meta["context_full"] = str(err)
                break
            traj.num_turns += 1
            turns_in_segment += 1
            parsed = chat.parse(text)
            calls += parsed.tool_calls
            if not parsed.tool_calls and not parsed.errors:
                break  # an answer without a tool call ends the session, as in the product's harness
            t0 = time.monotonic()
            try:
                obs, done = await asyncio.to_thread(env.step, parsed.tool_calls, parsed.errors)
            except Exception as err:
                raise EnvironmentFailure(f"tool execution failed: {err}") from err
            timings["env_s"] += time.monotonic() - t0
            if done:
                break
            seg.observe(chat.render_observation(obs))
        traj.segments.append(seg.build())
        t0 = time.monotonic()
        try:
            traj.reward = await asyncio.to_thread(env.grade)
        except Exception as err:
            raise EnvironmentFailure(f"grading failed for task {task.id}: {err}") from err
        timings["grade_s"] = time.monotonic() - t0
        if cfg.summary_reward_weight and summaries and traj.reward is not None:
            kept = sum(s["facts_kept"] for s in summaries) / len(summaries)  # a copy: the grade cache holds it
            traj.reward = dataclasses.replace(traj.reward, value=traj.reward.value + cfg.summary_reward_weight * kept,
                                              components={**traj.reward.components, "summary": kept})
        env_metrics = env.metrics() if hasattr(env, "metrics") else {}
        traj.num_tool_calls = int(env_metrics.get("num_tool_calls", 0))
        traj.num_tool_errors = int(env_metrics.get("num_tool_errors", 0))
    finally:
        await asyncio.to_thread(env.close)
    timings["total_s"] = time.monotonic() - t_start
    traj.timings = timings
    # update, not replace: `context_full` (and anything else set on the way) must survive to the metrics
    traj.meta.update({"submitted": done, "num_summaries": len(summaries), "summaries": summaries,
                      "num_sampled_tokens": total_sampled,
                      **{k: v for k, v in task.meta.items() if k in ("split", "difficulty", "mutation", "kind")}})
    return traj
