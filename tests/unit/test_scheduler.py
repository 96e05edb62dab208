"""Admission by priority (inference/scheduler.py), on plain stand-in requests: users are admitted before background
requests, background rows stay within their cap, and the batch size and prefill budget still hold."""

from dataclasses import dataclass, field

import pytest

from flywheel.inference.scheduler import AdmissionQueue


@dataclass
class Req:
    name: str
    priority: str = "user"
    prompt_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    cancelled: bool = False


def _names(rs):
    return [r.name for r in rs]


def test_users_are_admitted_before_background_whatever_the_arrival_order():
    q = AdmissionQueue(max_batch_size=4, max_background_rows=4)
    for i in range(3):
        q.push(Req(f"b{i}", "background"))
    q.push(Req("u0"))
    q.push(Req("u1"))
    assert _names(q.admit([])) == ["u0", "u1", "b0", "b1"]
    assert q.waiting("background") == 1 and q.waiting("user") == 0


def test_background_rows_stay_within_the_cap_and_leave_the_rest_to_users():
    q = AdmissionQueue(max_batch_size=8, max_background_rows=3)
    for i in range(10):
        q.push(Req(f"b{i}", "background"))
    running = q.admit([])
    assert _names(running) == ["b0", "b1", "b2"]  # 5 slots stay free although background is waiting
    assert q.admit(running) == []
    for i in range(5):
        q.push(Req(f"u{i}"))
    running += q.admit(running)
    assert len(running) == 8 and sum(r.priority == "user" for r in running) == 5
    running = [r for r in running if r.name != "b1"]  # a background row ends: one more background may join
    assert _names(q.admit(running)) == ["b3"]


def test_no_background_request_passes_a_user_waiting_for_the_prefill_budget():
    q = AdmissionQueue(max_batch_size=8, max_background_rows=8, max_prefill_tokens=10)
    q.push(Req("u0", prompt_ids=[0] * 8))
    q.push(Req("u1", prompt_ids=[0] * 8))  # over what is left of the budget: waits for the next step
    q.push(Req("b0", "background", prompt_ids=[0]))  # would fit the budget, but a user is waiting
    first = q.admit([])
    assert _names(first) == ["u0"]
    assert _names(q.admit(first)) == ["u1", "b0"]  # no user waits any more: background fills the budget's rest


def test_a_full_batch_admits_nothing_and_cancelled_requests_are_dropped():
    q = AdmissionQueue(max_batch_size=2, max_background_rows=2)
    q.push(Req("u0", cancelled=True))
    q.push(Req("u1"))
    q.push(Req("b0", "background"))
    assert q.admit([Req("r0"), Req("r1")]) == []
    assert _names(q.admit([])) == ["u1", "b0"]
    assert len(q) == 0


def test_a_prompt_larger_than_the_budget_is_still_admitted_alone():
    q = AdmissionQueue(max_batch_size=4, max_prefill_tokens=4)
    q.push(Req("u0", prompt_ids=[0] * 9))
    q.push(Req("u1"))
    assert _names(q.admit([])) == ["u0"]


@pytest.mark.parametrize("cap", [0, 5])
def test_a_cap_outside_the_batch_is_refused_with_a_clear_error(cap):
    with pytest.raises(ValueError, match=r"max_background_rows must be in \[1, max_batch_size=4\]"):
        AdmissionQueue(max_batch_size=4, max_background_rows=cap)


def test_an_unknown_priority_is_refused():
    with pytest.raises(ValueError, match="priority must be one of"):
        AdmissionQueue(max_batch_size=4).push(Req("x", "urgent"))


def test_beside_users_background_prefill_stays_within_its_own_budget():
    q = AdmissionQueue(max_batch_size=16, max_background_rows=16, max_prefill_tokens=4096,
                       max_background_prefill_tokens=500)
    for i in range(4):
        q.push(Req(f"b{i}", "background", prompt_ids=[0] * 400))
    user = Req("u-running")
    assert _names(q.admit([user])) == ["b0"]  # one agent prompt per step while a user decodes, not ten
    q.push(Req("u0"))
    assert _names(q.admit([])) == ["u0", "b1"]  # a user joining now: the same budget for what follows it
    assert _names(q.admit([])) == ["b2", "b3"]  # no user in the batch: the full prefill budget
