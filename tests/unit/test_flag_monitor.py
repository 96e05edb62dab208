"""The anti-cheat flag monitor: windowed rates, the halt threshold, ungraded sessions left out."""

import pytest

from flywheel.orchestrator.monitor import FlagMonitor, step_flag_rates
from flywheel.types import Reward, Trajectory


def session(*flags: str, graded: bool = True) -> Trajectory:
    return Trajectory(task_id="t", group_id="g", reward=Reward(0.0, flags=list(flags)) if graded else None)


def test_rates_slide_over_the_window_and_ignore_ungraded_sessions():
    m = FlagMonitor(window=4, halt_rate=0.5)
    m.observe([session("runner_tampered"), session(), session(graded=False)])
    assert m.rates() == {"runner_tampered": 0.5} and m.tripped() is None  # window not full yet
    m.observe([session("runner_tampered", "framework_patch"), session()])
    assert m.rates() == {"framework_patch": 0.25, "runner_tampered": 0.5}
    assert m.tripped() is None  # 0.5 is not above 0.5
    m.observe([session("runner_tampered")])  # the first session leaves the window, this one enters
    assert m.rates() == {"framework_patch": 0.25, "runner_tampered": 0.5}
    m.observe([session("runner_tampered")])
    assert m.rates() == {"framework_patch": 0.25, "runner_tampered": 0.75}
    assert m.tripped() == ("runner_tampered", 0.75)
    m.observe([session(), session(), session(), session()])
    assert m.rates() == {} and m.tripped() is None


def test_off_by_default_and_bad_settings_are_refused():
    m = FlagMonitor(window=1)
    m.observe([session("tool_spam")])
    assert m.rates() == {"tool_spam": 1.0} and m.tripped() is None
    with pytest.raises(ValueError, match="flag_rate_window"):
        FlagMonitor(window=0)
    with pytest.raises(ValueError, match="halt_on_flag_rate"):
        FlagMonitor(window=8, halt_rate=1.5)


def test_step_rates_count_each_session_once():
    groups = [[session("tool_spam", "tool_spam"), session()], [session(graded=False), session("outside_read")]]
    assert step_flag_rates(groups) == {"flags/rate/outside_read": 1 / 3, "flags/rate/tool_spam": 1 / 3}
    assert step_flag_rates([[session(graded=False)]]) == {}
