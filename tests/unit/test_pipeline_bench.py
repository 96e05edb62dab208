"""`flywheel bench pipeline --set`: config overrides reach both runs; a malformed pair says what to write."""

from pathlib import Path

import pytest

from flywheel.bench.pipeline import _swapped, bench_config, parse_seeds, set_overrides, summarize
from flywheel.config import ConfigError


def test_set_overrides_both_modes_but_not_the_bench_keys():
    settings = set_overrides(["trainer.correction=none", "trainer.num_steps=99"])
    for mode in ("sync", "async"):
        cfg = bench_config(Path("/tmp/unused"), mode, False, "local", settings)
        assert cfg.trainer.correction == "none" and cfg.orchestrator.mode == mode
        assert cfg.trainer.num_steps == 16  # the bench's step count wins: both runs take the same steps


def test_bad_set_pairs_are_refused_with_what_to_write():
    with pytest.raises(SystemExit, match="expected SECTION.KEY=VALUE"):
        set_overrides(["trainer.correction"])
    with pytest.raises(ConfigError, match="unknown key 'trainer.corection'"):
        bench_config(Path("/tmp/unused"), "sync", False, "local", set_overrides(["trainer.corection=none"]))


def test_seeds_parse_and_bad_lists_say_what_to_write():
    assert parse_seeds(None) is None and parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("0,one", "1,1", "-1", ""):
        with pytest.raises(SystemExit, match="--seeds"):
            parse_seeds(bad)


def _pair(sync_wall, async_wall, busy, p_sync, p_async, gap_se):
    return {"sync": {"wall_s": sync_wall, "trainer_busy": 0.4, "pass1": p_sync},
            "async": {"wall_s": async_wall, "trainer_busy": busy, "pass1": p_async},
            "passk_gap": p_async - p_sync, "passk_gap_se": gap_se}


def test_summary_averages_the_pairs_and_measures_the_spread_over_seeds():
    one = summarize([_pair(300, 200, 0.9, 0.47, 0.44, 0.02)])
    assert one["sync_over_async_wall"] == pytest.approx(1.5) and one["passk_gap"] == pytest.approx(-0.03)
    assert one["passk_gap_se"] == pytest.approx(0.02) and "passk_gap_se_seeds" not in one
    three = summarize([_pair(300, 200, 0.9, 0.47, 0.44, 0.02), _pair(320, 160, 0.8, 0.40, 0.42, 0.02),
                       _pair(330, 300, 0.95, 0.50, 0.50, 0.02)])
    assert three["sync_over_async_wall"] == pytest.approx(1.5)  # median of 1.5, 2.0, 1.1
    assert three["async_trainer_busy"] == pytest.approx(0.9)
    assert three["passk_sync"] == pytest.approx((0.47 + 0.40 + 0.50) / 3)
    assert three["passk_async"] == pytest.approx((0.44 + 0.42 + 0.50) / 3)
    assert three["passk_gap"] == pytest.approx((-0.03 + 0.02 + 0.0) / 3)
    assert three["passk_gap_per_seed"] == pytest.approx([-0.03, 0.02, 0.0])
    # gaps -0.03, 0.02, 0: mean -1/300, sample sd sqrt(((-0.08/3)² + (0.07/3)² + (0.01/3)²) / 2) = 0.0251661
    assert three["passk_gap_se_seeds"] == pytest.approx(0.0251661 / 3 ** 0.5, rel=1e-5)
    assert three["passk_gap_se"] == pytest.approx((3 * 0.02 ** 2) ** 0.5 / 3)  # eval noise of the mean


def test_summary_reports_the_pinned_pairs():
    pair = _pair(300, 200, 0.9, 0.47, 0.44, 0.02)
    pair["sync_pinned"] = {"wall_s": 240, "trainer_busy": 0.5}
    pair["async_pinned"] = {"wall_s": 120, "trainer_busy": 0.95}
    out = summarize([pair])
    assert out["sync_over_async_wall_pinned"] == pytest.approx(2.0) and out["async_trainer_busy_pinned"] == 0.95
    assert "sync_over_async_wall_pinned" not in summarize([_pair(300, 200, 0.9, 0.47, 0.44, 0.02)])


def test_order_alternates_within_each_pair_of_runs():
    runs = [("sync", "sync", "local", False), ("async", "async", "local", False),
            ("sync_pinned", "sync", "local", True), ("async_pinned", "async", "local", True)]
    assert [r[0] for r in _swapped(runs)] == ["async", "sync", "async_pinned", "sync_pinned"]
