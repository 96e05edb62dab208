"""The online loop's pure parts: the gate's paired test and monitors, deploy history, the live monitor, the running
baseline, token-exact samples, rate limits, request validation, and the event log on a real SQLite file."""

import json

import pytest
import torch

from flywheel.config import load_config
from flywheel.config.online import GateConfig, ServeConfig
from flywheel.online.deploy import LiveMonitor, deploy_stack, deployed_version, rollback, rollback_target
from flywheel.online.events import CompletionRecord, DuplicateError, Event, EventLog, FeedbackRecord
from flywheel.online.gate import EvalRecord, judge, sign_test_p_worse
from flywheel.online.keys import RateLimiter, hash_key, new_key
from flywheel.online.learner import RunningBaseline, signal_reward, trajectory_from
from flywheel.online.protocol import ApiError, parse_chat_request
from flywheel.trainer.advantages import compute_advantages


def test_sign_test_matches_hand_computed_binomial_tails():
    assert sign_test_p_worse(0, 5) == pytest.approx(1 / 32)
    assert sign_test_p_worse(2, 3) == pytest.approx((10 + 5 + 1) / 32)
    assert sign_test_p_worse(5, 0) == 1.0
    assert sign_test_p_worse(0, 0) == 1.0  # all ties: no evidence of a regression


def _recs(scores, **kw):
    return [EvalRecord(float(s), **kw) for s in scores]


def test_gate_rejects_a_significant_regression_and_passes_an_improvement():
    cfg = GateConfig(alpha=0.05, max_mean_drop=0.5)
    serving = _recs([1] * 10 + [0] * 10)
    worse = _recs([0] * 10 + [0] * 10)  # lost 10, won 0: p = 2^-10
    v = judge(serving, worse, cfg)
    assert not v.passed and "significant regression" in v.reason and v.figures["losses"] == 10
    better = _recs([1] * 10 + [1] * 5 + [0] * 5)
    v = judge(serving, better, cfg)
    assert v.passed and v.figures["wins"] == 5 and v.figures["losses"] == 0


def test_gate_rejects_a_small_but_large_mean_drop_and_hack_monitor_rises():
    cfg = GateConfig(alpha=0.001, max_mean_drop=0.05, max_broken_tool_call_increase=0.05)
    serving = _recs([1] * 4 + [0] * 16)
    v = judge(serving, _recs([0] * 1 + [1] * 3 + [0] * 16), cfg)  # one loss: not significant, but -0.05 < ...
    assert v.passed  # a drop of exactly the margin passes
    v = judge(serving, _recs([0] * 2 + [1] * 2 + [0] * 16), cfg)
    assert not v.passed and "mean held-out score fell" in v.reason
    broken = [EvalRecord(r.score, broken_tool_call=i < 4) for i, r in enumerate(serving)]
    v = judge(serving, broken, cfg)
    assert not v.passed and "broken_tool_call_rate" in v.reason
    flagged = [EvalRecord(r.score, flags=["runner_tampered"] if i == 0 else []) for i, r in enumerate(serving)]
    assert not judge(serving, flagged, cfg).passed


def _ev(kind, v):
    return Event(kind, v, "r")


def test_deploy_history_is_a_stack_and_rollback_pops_it():
    evs = [_ev("deploy", 0), _ev("deploy", 3), _ev("deploy", 5)]
    assert deploy_stack(evs) == [0, 3, 5] and rollback_target(evs) == 3
    evs.append(_ev("rollback", 3))
    assert deployed_version(evs) == 3 and rollback_target(evs) == 0
    evs += [_ev("deploy", 7), _ev("rollback", 3), _ev("rollback", 0)]
    assert deployed_version(evs) == 0 and rollback_target(evs) is None
    assert deployed_version([]) is None


def test_live_monitor_flags_a_drop_only_over_a_full_window():
    m = LiveMonitor(window=4, drop=0.3)
    for r in [0.75, 0.75, -0.25, 0.75]:
        m.observe(1, r)
    for r in [-0.25, -0.25, -0.25]:
        m.observe(2, r)
    assert m.verdict(2, 1) is None  # 3 of 4
    m.observe(2, 0.75)
    why = m.verdict(2, 1)
    assert why is not None and "version 2" in why and "0.000" in why
    assert m.verdict(2, None) is None


def test_running_baseline_is_a_bias_corrected_mean_of_earlier_rewards():
    b = RunningBaseline(0.5)
    assert b.advantage(1.0) == 1.0  # no earlier reward: baseline 0
    assert b.value == pytest.approx(1.0)
    assert b.advantage(0.0) == pytest.approx(-1.0)
    assert b.value == pytest.approx(0.25 / 0.75)
    assert signal_reward("accept", {"accept": 0.75}) == 0.75 and signal_reward("thumbs_up", {}) is None


def test_a_sample_is_the_served_tokens_with_loss_on_the_reply_only():
    cpl = CompletionRecord("c1", "k", "m", 2, [5, 6, 7], [8, 9], [-0.5, -1.5], [2, 3], "stop", "x")
    fb = FeedbackRecord("f1", "c1", "k", "accept", seq=4)
    t = trajectory_from(fb, cpl, 0.5, 0.75)
    s = t.segments[0]
    assert s.token_ids == [5, 6, 7, 8, 9] and s.loss_mask == [0, 0, 0, 1, 1]
    assert s.logprobs == [0.0, 0.0, 0.0, -0.5, -1.5] and s.versions == [-1, -1, -1, 2, 3]
    assert t.reward.value == 0.5 and t.min_version == 2
    adv = compute_advantages([0.5, -0.25], ["a", "b"], "given")
    assert adv.tolist() == [0.5, -0.25]


def test_rate_limiter_is_a_token_bucket():
    now = [0.0]
    rl = RateLimiter(clock=lambda: now[0])
    assert [rl.allow("k", 2)[0] for _ in range(3)] == [True, True, False]
    ok, retry = rl.allow("k", 2)
    assert not ok and retry == pytest.approx(30.0)
    now[0] = 30.0
    assert rl.allow("k", 2)[0] and not rl.allow("k", 2)[0]
    assert rl.allow("other", 2)[0]


def test_keys_are_stored_as_hashes():
    key, rec = new_key("ana", 60, 4096)
    assert key.startswith("fw-") and rec.key_hash == hash_key(key) and key not in json.dumps(vars(rec))
    with pytest.raises(ValueError):
        new_key("", 60, 4096)


@pytest.mark.parametrize("body, status, param", [
    ([], 400, None),
    ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "m", "messages": []}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools[0]"),
    ({"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]},
        {"role": "user", "content": "x"}]}, 400, "messages[0].tool_calls[0]"),
])
def test_bad_requests_name_the_field(body, status, param):
    with pytest.raises(ApiError) as e:
        parse_chat_request(body, "m", 256, 16)
    assert e.value.status == status and e.value.param == param


def test_tool_turns_map_onto_messages():
    req = parse_chat_request({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "view", "arguments": '{"path": "a.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"}],
        "tools": [{"type": "function", "function": {"name": "view", "parameters": {"type": "object"}}}],
        "max_tokens": 8, "stop": "\n"}, "m", 256, 16)
    assert req.messages[0].content == "fix it"
    assert req.messages[1].tool_calls[0].arguments == {"path": "a.py"} and req.messages[2].name == "view"
    assert req.tools[0]["name"] == "view" and req.sampling.max_new_tokens == 8 and req.sampling.stop == ["\n"]


def test_online_config_refuses_unknown_signals():
    with pytest.raises(ValueError, match="unknown signals"):
        load_config(None, ["--online.learner.rewards", '{accept = 1.0, smile = 2.0}'])
    assert ServeConfig().max_body_bytes == 1 << 20


def test_event_log_round_trip_on_sqlite_wal(tmp_path):
    elog = EventLog(tmp_path / "log.db")
    with elog.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    _, rec = new_key("ana", 60, 4096)
    elog.add_key(rec)
    assert elog.key_by_hash(rec.key_hash).name == "ana" and elog.key_by_hash("0" * 64) is None
    cpl = CompletionRecord("c1", rec.key_id, "m", 0, [1, 2], [3], [-0.25], [0], "stop", "hi")
    elog.record_completion(cpl)
    with pytest.raises(DuplicateError):
        elog.record_completion(cpl)
    elog.record_feedback(FeedbackRecord("f1", "c1", rec.key_id, "accept"))
    ((fb, got),) = elog.feedback_after(0)
    assert fb.signal == "accept" and got.token_ids == [3] and got.logprobs == [-0.25]
    assert elog.feedback_after(fb.seq) == []
    elog.append_event("deploy", 0, "initial")
    elog.append_event("deploy", 1, "gate passed")
    ev = rollback(elog, "manual: test")
    assert ev.version == 0 and ev.data["from_version"] == 1
    with pytest.raises(ValueError, match="nothing to roll back"):
        rollback(elog, "again")
    with pytest.raises(ValueError):
        elog.append_event("launch", 1, "no such kind")


def test_subscriber_installs_an_older_version_for_a_rollback(tmp_path):
    from flywheel.weights.sync import Publisher, Subscriber

    class Sink:
        version = -1

        def update_weights(self, v, tensors):
            self.version, self.t = v, {k: t.clone() for k, t in tensors.items()}
            return 0.0

    states = [{"w": torch.full((64,), float(i))} for i in range(4)]
    with Publisher(str(tmp_path / "w"), anchor_every=10) as pub:
        for i, s in enumerate(states):
            pub.publish(i, s).result()
    sink = Sink()
    sub = Subscriber(str(tmp_path / "w"), sink)
    assert sub.poll() == 3 and sink.version == 3
    assert sub.poll(target=1) == 1 and torch.equal(sink.t["w"], states[1]["w"])
    assert sub.poll(target=2) == 2 and torch.equal(sink.t["w"], states[2]["w"])  # forward again, by delta
    assert sub.poll(target=2) is None and sub.poll(target=9) is None and "not in the store" in str(sub.last_error)
    sub.close()
