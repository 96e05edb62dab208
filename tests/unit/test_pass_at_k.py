import pytest

from flywheel.rollout.evaluate import pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3)
    assert pass_at_k(3, 2, 2) == 1.0


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(2, 1, 4)
