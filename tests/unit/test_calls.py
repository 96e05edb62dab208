"""Function-level grading by data: the encoding, the grader's comparison, the reply parser and HumanEval's asserts
turned into calls (tasks/callee.py, tasks/datatests.py, envs/calls.py). The sandboxed end-to-end path and the
attacks on it: tests/redteam/."""

import json
import re

import pytest

from flywheel.envs.calls import judge, read_results
from flywheel.tasks.callee import decode, encode
from flywheel.tasks.datatests import call, check_call, humaneval_calls


@pytest.mark.parametrize("value", [None, True, 0, -3, 2**80, 1.5, float("inf"), "é", b"\x00\xff", [1, (2, "a")],
                                   {"k": [1], 3: None}, {1, 2}, frozenset({"x"}), ((),)])
def test_encode_decode_round_trips_exact_types(value):
    back = decode(json.loads(json.dumps(encode(value))))
    assert back == value and type(back) is type(value)


def test_nan_round_trips_as_a_float():
    back = decode(json.loads(json.dumps(encode(float("nan")))))
    assert type(back) is float and back != back


class _Int(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value", [_Int(1), [_Int(1)], {"a": _Int(1)}, object(), lambda: 1, range(3)])
def test_anything_but_exact_builtins_cannot_be_encoded(value):
    with pytest.raises(TypeError):
        encode(value)


@pytest.mark.parametrize("data", [{"tuple": [1], "list": [2]}, {"evil": 1}, {"dict": [[1]]}, {"float": "1e3"},
                                  {"list": "abc"}])
def test_malformed_data_is_refused(data):
    with pytest.raises(ValueError):
        decode(data)


def test_judge_applies_each_rule():
    assert judge(call("t", "m", "f", (), 2.0), 2)  # builtin equality, as the assert said
    assert not judge(call("t", "m", "f", (), [1]), (1,))
    assert judge(call("t", "m", "f", (), 0.15, "close", 1e-9), 0.1 + 0.05)
    assert not judge(call("t", "m", "f", (), 0.15, "close", 1e-9), 0.2)
    assert not judge(call("t", "m", "f", (), 0.15, "close", 1e-9), "0.15")
    assert not judge(call("t", "m", "f", (), 0.15, "close", 1e-9), float("nan"))
    assert judge(call("t", "m", "f", (), compare="truthy"), [0]) and judge(call("t", "m", "f", (), compare="falsy"), "")


def test_read_results_aggregates_per_test_and_distrusts_the_reply():
    calls = [call("a", "m", "f", (1,), 1), call("a", "m", "f", (2,), 4), call("b", "m", "f", (3,), 9)]
    good = json.dumps({"results": [{"i": 0, "ok": True, "value": 1}, {"i": 1, "ok": True, "value": 4},
                                   {"i": 2, "ok": True, "value": 9}]})
    assert read_results(good, calls) == ({"a": "passed", "b": "passed"}, True)
    # one wrong call fails its whole test; a repeated index keeps its first answer; an unknown index is ignored
    mixed = json.dumps({"results": [{"i": 0, "ok": True, "value": 1}, {"i": 1, "ok": True, "value": 5},
                                    {"i": 1, "ok": True, "value": 4}, {"i": 7, "ok": True, "value": 0},
                                    {"i": 2, "ok": False, "error": "boom"}]})
    assert read_results(mixed, calls) == ({"a": "failed", "b": "error"}, True)
    assert read_results('{"results": [{"i": 2, "ok": true}]}', calls)[0] == {"a": "missing", "b": "failed"}
    assert read_results("not json", calls) == ({"a": "missing", "b": "missing"}, False)
    assert read_results('{"results": [{"i": 2, "ok": true, "value": {"__eq__": 1}}]}', calls)[0]["b"] == "error"


def test_humaneval_plain_asserts_become_calls_and_anything_else_does_not():
    test = ("METADATA = {}\n\ndef check(candidate):\n    \"\"\"doc\"\"\"\n    assert candidate(1, [2]) == (3,)\n"
            "    assert 4 == candidate(0, [])\n    assert abs(candidate(-1, []) - 0.5) < 1e-6\n"
            "    assert candidate(2, [])\n    assert not candidate(3, [])\n    assert True\n"
            "    assert candidate(5, []) is None, 'msg'\n")
    entries = humaneval_calls(test, "solution", "f", "test_solution.py::test_check")
    assert [(decode(e["args"]), e["compare"]) for e in entries] == [
        ((1, [2]), "eq"), ((0, []), "eq"), ((-1, []), "close"), ((2, []), "truthy"), ((3, []), "falsy"),
        ((5, []), "eq")]
    assert decode(entries[0]["expected"]) == (3,) and entries[2]["tol"] == 1e-6
    assert all(check_call(e) is None for e in entries)
    folded = humaneval_calls("def check(candidate):\n    print\n    assert candidate(3 * 19, [0**0]) == (3 + 5, 'ab' * 2)\n"
                             "    assert abs(candidate(-2, []) - 2.0/3.0) < 1e-6\n", "solution", "f", "t")
    assert [decode(e["args"]) for e in folded] == [(57, [1]), (-2, [])]
    assert decode(folded[0]["expected"]) == (8, "abab") and decode(folded[1]["expected"]) == 2.0 / 3.0
    for body in ("    for x in range(3):\n        assert candidate(x) == x\n",  # loop
                 "    assert candidate(10 ** 100) == 1\n",                      # a power too large to fold
                 "    assert candidate('a' * 100000) == 1\n",                   # a string too long to fold
                 "    assert candidate(1 / 0) == 1\n",                          # an error is not a constant
                 "    undefined_name\n    assert candidate(1) == 1\n",          # a statement that is not a no-op
                 "    assert candidate(1) == helper(1)\n",                       # computed expected value
                 "    assert candidate(x=1) == 1\n",                             # keywords
                 "    import math\n    assert math.isclose(candidate(1), 1)\n"):
        assert humaneval_calls(f"def check(candidate):\n{body}", "solution", "f", "t") is None


@pytest.mark.parametrize("entry,message", [
    ({"id": "t", "module": "m"}, "calls\\[\\].function"),
    ({"id": "t", "module": "m", "function": "f", "compare": "gt"}, "compare must be one of"),
    ({"id": "t", "module": "m", "function": "f", "args": {"list": [1]}}, "args must encode a tuple"),
    ({"id": "t", "module": "m", "function": "f", "expected": {"bogus": 1}}, "unknown tag"),
    ({"id": "t", "module": "m", "function": "f", "extra": 1}, "unknown keys"),
])
def test_malformed_calls_are_refused_with_what_to_change(entry, message):
    assert re.search(message, check_call(entry) or "")
