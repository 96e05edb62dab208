import pytest

from flywheel.rollout.evaluate import paired_difference, pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3)
    assert pass_at_k(3, 2, 2) == 1.0


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(2, 1, 4)


def _rows(rates: dict[str, tuple[int, int]]) -> list[dict]:
    return [{"task_id": t, "n": n, "correct": c} for t, (c, n) in rates.items()]


def test_paired_difference_hand_values():
    after = _rows({"a": (1, 1), "b": (1, 1), "c": (0, 1), "d": (2, 4)})
    before = _rows({"a": (0, 1), "b": (1, 1), "c": (0, 1), "d": (0, 4), "only_before": (1, 1)})
    mean, se, m = paired_difference(after, before)
    # per-task differences 1, 0, 0, 0.5: mean 0.375, sample variance 0.2292, SE sqrt(0.2292 / 4)
    assert m == 4
    assert mean == pytest.approx(0.375)
    assert se == pytest.approx((((0.625**2 + 0.375**2 * 2 + 0.125**2) / 3) / 4) ** 0.5)


def test_paired_difference_skips_unscored_tasks_and_needs_overlap():
    mean, se, m = paired_difference(_rows({"a": (1, 1), "b": (0, 0)}), _rows({"a": (0, 1), "b": (1, 1)}))
    assert (mean, se, m) == (1.0, 0.0, 1)
    with pytest.raises(ValueError, match="share no scored task"):
        paired_difference(_rows({"a": (1, 1)}), _rows({"z": (1, 1)}))
