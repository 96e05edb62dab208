"""Self-summarization as part of the policy: the agent loop's bookkeeping (context full, the cap, bad summaries,
the summary reward) and the trainer's handling of a multi-segment trajectory (one advantage, one row per segment,
no attention across segments when packed, sampler log-probs exact per segment). Scripted engine; ~5 s."""

import asyncio

import pytest
import torch

from flywheel.config import EnvConfig, ModelConfig, RolloutConfig, TrainerConfig
from flywheel.envs.env import CodingEnv
from flywheel.policy.logprobs import token_logprobs
from flywheel.policy.model import build_model
from flywheel.rollout.agent import SUMMARY_PREFIX, run_session
from flywheel.rollout.summary import CALLS_NOTE, EMPTY_NOTE, check_summary, fact_recall, session_facts
from flywheel.tasks.synth import generate_tasks, oracle_actions
from flywheel.trainer.train import Trainer, rows_from_trajectories
from flywheel.types import Generation, Message, Reward, Segment, ToolCall, Trajectory

ENV = EnvConfig(sandbox="local", tools="core")


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(2, seed=11, split="train", difficulty="easy")


class ScriptedEngine:
    """Replays assistant messages as sampled tokens; `refuse_at` (a call index) raises the engine's ValueError
    for a context that does not fit, as LocalEngine does."""

    def __init__(self, chat, turns, refuse_at: int | None = None, cut_at: int | None = None):
        self.chat, self.turns, self.refuse_at, self.cut_at, self.calls = chat, list(turns), refuse_at, cut_at, 0

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        if self.refuse_at is not None and self.calls >= self.refuse_at:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of 64 tokens")
        msg = self.turns.pop(0) if self.turns else Message("assistant", "nothing more to do")
        ids = self.chat.assistant_tokens(msg)[: min(sampling.max_new_tokens, self.cut_at or 10**9)]
        return Generation(ids, [-0.5] * len(ids), [1] * len(ids), finish_reason="stop")


def oracle_turns(task):
    return [Message("assistant", "", tool_calls=[c]) for c in oracle_actions(task)]


def session(chat, task, turns, tmp_path, **kw):
    engine_kw = {k: kw.pop(k) for k in ("refuse_at", "cut_at") if k in kw}
    engine = ScriptedEngine(chat, turns, **engine_kw)
    return asyncio.run(run_session(engine, chat, CodingEnv(ENV, tmp_path), task, RolloutConfig(**kw)))


def prompt_len(chat, task, tmp_path):
    return len(chat.render(CodingEnv(ENV, tmp_path).reset(task)))


def test_context_full_is_kept_in_the_trajectory_meta(chat, tasks, tmp_path):
    # Before the fix the final `traj.meta = {...}` replaced the dict, so context_full_rate was always 0.
    view, _, _ = oracle_turns(tasks[0])
    traj = session(chat, tasks[0], [view], tmp_path, max_turns=6, refuse_at=2)
    assert "does not fit" in traj.meta["context_full"]
    assert traj.num_turns == 1 and traj.meta["num_summaries"] == 0 and traj.reward is not None


def test_a_full_context_at_the_summary_request_ends_the_session_cleanly(chat, tasks, tmp_path):
    view, _, _ = oracle_turns(tasks[0])
    n = prompt_len(chat, tasks[0], tmp_path)
    traj = session(chat, tasks[0], [view], tmp_path, max_turns=6, summarize_at=n + 5, refuse_at=2)
    assert "does not fit" in traj.meta["context_full"] and traj.meta["num_summaries"] == 0
    assert len(traj.segments) == 1 and traj.reward is not None


def test_max_summaries_caps_a_session_that_would_summarize_forever(chat, tasks, tmp_path):
    view = oracle_turns(tasks[0])[0]
    n = prompt_len(chat, tasks[0], tmp_path)
    turns = [view, Message("assistant", "I viewed it."), view, Message("assistant", "Again."), view, view]
    traj = session(chat, tasks[0], turns, tmp_path, max_turns=4, summarize_at=n + 5, max_summaries=2)
    assert traj.meta["num_summaries"] == 2 and len(traj.segments) == 3 and traj.num_turns == 4
    for rec in traj.meta["summaries"]:
        assert rec["tokens_before"] > n + 5 and rec["tokens_after"] < rec["tokens_before"] and rec["problem"] is None
    uncapped = session(chat, tasks[0], list(turns), tmp_path, max_turns=4, summarize_at=n + 5, max_summaries=0)
    assert uncapped.meta["num_summaries"] == 0 and len(uncapped.segments) == 1


@pytest.mark.parametrize("summary,problem,shown", [
    (Message("assistant", "   "), "empty", EMPTY_NOTE),
    (Message("assistant", "I viewed it.", tool_calls=[ToolCall("submit", {})]), "tool_calls",
     CALLS_NOTE.format(n=1)),
    (Message("assistant", '<tool_call>{"name": "submit", "arg'), "tool_calls+empty", EMPTY_NOTE),
    (Message("assistant", "word " * 200), "too_long", "(Your summary was cut at 20 tokens"),
])
def test_a_bad_summary_becomes_a_note_in_the_rebuilt_context(chat, tasks, tmp_path, summary, problem, shown):
    task = tasks[1]
    view, edit, submit = oracle_turns(task)
    n = prompt_len(chat, task, tmp_path)
    traj = session(chat, task, [view, summary, edit, submit], tmp_path, max_turns=6, summarize_at=n + 5,
                   max_summaries=1, summary_max_tokens=20)
    assert traj.meta["summaries"][0]["problem"] == problem
    second = chat.tokenizer.decode(traj.segments[1].token_ids)
    assert SUMMARY_PREFIX in second and shown in second
    assert not traj.meta["submitted"] or traj.num_turns == 3  # the summary's own submit call was never run
    assert traj.reward.value == 1.0  # the session went on after the bad summary and solved the task


def test_a_summary_cut_at_the_token_limit_is_marked(chat, tasks, tmp_path):
    task = tasks[1]
    view, edit, submit = oracle_turns(task)
    n = prompt_len(chat, task, tmp_path)
    long_summary = Message("assistant", "I viewed the file and " + "found things " * 40)
    traj = session(chat, task, [view, long_summary, edit, submit], tmp_path, max_turns=6, summarize_at=n + 5,
                   max_summaries=1, max_new_tokens=60, summary_max_tokens=500)
    assert traj.meta["summaries"][0]["problem"] == "cut"
    assert "(Your summary was cut at 60 tokens" in chat.tokenizer.decode(traj.segments[1].token_ids)


def test_summary_reward_adds_the_share_of_facts_kept(chat, tasks, tmp_path):
    task = tasks[1]
    view, edit, submit = oracle_turns(task)
    path = view.tool_calls[0].arguments["path"]
    n = prompt_len(chat, task, tmp_path)
    summary = Message("assistant", f"I viewed {path}.")
    facts = session_facts(task, view.tool_calls)
    expected = fact_recall(summary.content, facts)
    assert path in facts and 0 < expected < 1  # the failing tests were not named
    kw = {"max_turns": 6, "summarize_at": n + 5, "max_summaries": 1}
    off = session(chat, task, [view, summary, edit, submit], tmp_path, **kw)
    on = session(chat, task, [view, summary, edit, submit], tmp_path, summary_reward_weight=0.5, **kw)
    assert off.reward.value == 1.0 and "summary" not in off.reward.components
    assert on.meta["summaries"][0]["facts_kept"] == pytest.approx(expected)
    assert on.reward.components["summary"] == pytest.approx(expected)
    assert on.reward.value == pytest.approx(1.0 + 0.5 * expected)


def test_check_summary_and_fact_recall_by_hand():
    enc = lambda s: s.split()  # noqa: E731  (a word "tokenizer")
    dec = " ".join
    assert check_summary(" fixed a.py ", 0, 3, 10, False, enc, dec) == ("fixed a.py", None)
    assert check_summary("a b c d", 0, 4, 2, False, enc, dec)[1] == "too_long"
    assert check_summary("a b c d", 0, 4, 2, False, enc, dec)[0].endswith("\na b")
    assert check_summary("", 2, 0, 2, True, enc, dec) == (EMPTY_NOTE, "tool_calls+cut+empty")
    assert fact_recall("edited a.py", ["a.py", "b.py"]) == 0.5 and fact_recall("x", []) == 0.0


def _two_segment_trajectory(model, reward, group):
    """Two context windows of one session, each with the model's own log-probs as the sampler's."""
    g = torch.Generator().manual_seed(len(group) + int(reward * 10))
    segs = []
    for p, c in ((6, 4), (5, 3)):
        ids = torch.randint(3, 64, (p + c,), generator=g).tolist()
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([ids]))[0]
        segs.append(Segment(ids, [0] * p + [1] * c, [0.0] * p + [float(x) for x in lp[p - 1:]],
                            [-1] * p + [0] * c))
    return Trajectory(task_id=group, group_id=group, segments=segs, reward=Reward(value=reward))


@pytest.mark.parametrize("pack", [False, True])
def test_trainer_one_advantage_per_session_one_row_per_segment_no_cross_attention(pack):
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny", seed=0), vocab_size=64)
    batch = [_two_segment_trajectory(model, r, "g") for r in (0.0, 1.0)]
    rows = rows_from_trajectories(batch)
    assert [(r.seq, r.segment) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    cfg = TrainerConfig(lr=1e-3, batch_size=2, micro_batch_tokens=4096, pack_sequences=pack)
    trainer = Trainer(model, cfg)
    metrics = trainer.step(batch)
    assert metrics["num_rows"] == 4 and metrics["num_trajectories"] == 2
    # GRPO over the two sessions (rewards 0 and 1: advantages -/+ 1/sqrt(2)), not over four segments
    assert metrics["advantage_abs_mean"] == pytest.approx(2 ** -0.5, rel=1e-4)
    if pack:
        assert metrics["num_micro_batches"] == 1  # all four segments in one packed sequence
    # Every segment's recomputed log-probs equal the sampler's (the model's own, alone): no segment attended
    # to another, and the summary turn at a segment's end is scored in its own window.
    assert metrics["mismatch/k3"] == pytest.approx(0.0, abs=1e-6)
    for i, traj in enumerate(batch):
        got = trainer.recomputed_logprobs(i)
        for seg, lps in zip(traj.segments, got):
            for lp, want, m in zip(lps, seg.logprobs, seg.loss_mask):
                assert (lp is None) == (not m) and (lp is None or lp == pytest.approx(want, abs=1e-5))


def test_summary_metrics_by_hand():
    from flywheel.rollout.summary_metrics import summary_metrics

    def traj(num, submitted, passed, lengths, full=False):
        segs = [Segment([1] * n, [0] * n, [0.0] * n, [-1] * n) for n in lengths]
        recs = [{"tokens_before": 500, "tokens_after": 300, "problem": None if i else "empty", "facts_kept": 0.5}
                for i in range(num)]
        meta = {"num_summaries": num, "summaries": recs, "submitted": submitted, **({"context_full": "x"} if full else {})}
        return Trajectory("t", "g", segments=segs, reward=Reward(1.0 if passed else 0.0, {"tests": float(passed)}),
                          meta=meta)

    m = summary_metrics([traj(0, False, False, [640], full=True), traj(1, True, True, [600, 400]),
                         traj(2, True, False, [600, 500, 300]), traj(2, True, True, [600, 600, 600])], max_seq_len=640)
    assert m["summaries_per_session"] == 1.25 and m["summarized_rate"] == 0.75
    assert m["finish_after_summary_rate"] == 0.75 and m["solved_after_summary_rate"] == 0.5
    assert m["context_full_rate"] == 0.25
    assert m["pass1_by_summaries"] == {"0": 0.0, "1": 1.0, "2+": 0.5}
    assert m["tokens_processed_per_session_p50"] == (1000 + 1400) / 2 and m["tokens_processed_per_session_max"] == 1800
    assert m["tokens_before_summary_mean"] == 500 and m["summary_problem_rate"] == pytest.approx(3 / 5)
    assert m["tokens_processed_solved_2plus_p50_over_window"] == pytest.approx(1800 / 640)
    assert summary_metrics([]) == {}


def test_resume_reads_a_multi_segment_trajectory_back_whole(chat, tasks, tmp_path):
    """What a killed run restores (orchestrator/loop.py AdmittedLog) is the whole session: every segment, its
    summary records and its reward, token for token."""
    from flywheel.orchestrator.loop import AdmittedLog

    view, edit, submit = oracle_turns(tasks[1])
    n = prompt_len(chat, tasks[1], tmp_path)
    traj = session(chat, tasks[1], [view, Message("assistant", "viewed"), edit, submit], tmp_path / "s",
                   max_turns=6, summarize_at=n + 5, max_summaries=1)
    assert len(traj.segments) == 2
    log = AdmittedLog(tmp_path / "trajectories" / "admitted.jsonl")
    log.append([traj])
    log.close()
    with open(tmp_path / "trajectories" / "admitted.jsonl", "a") as f:
        f.write('{"index": 1, "group": [{"task_id"')  # the torn line a kill leaves
    again = AdmittedLog(tmp_path / "trajectories" / "admitted.jsonl")
    (index, (back,)), = list(again.read())
    again.close()
    assert index == 0 and back.to_dict() == traj.to_dict()


def test_bench_refuses_a_base_whose_context_is_not_the_window(tmp_path):
    import json

    from flywheel.bench.summarize import _check_base

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    with pytest.raises(SystemExit, match="tokenizer.json"):
        _check_base(tmp_path, 640)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match="context is 2048 tokens"):
        _check_base(tmp_path, 640)
    _check_base(tmp_path, 2048)
