"""The `[mine]` limits (config/mine.py) and how `flywheel tasks mine` takes them: the candidate timeout follows the
baseline within its bounds, and a wrong value is refused with the key to change.

    pytest tests/unit/test_mine_config.py
"""

from __future__ import annotations

import pytest

from flywheel.cli import main
from flywheel.config import ConfigError, load_config
from flywheel.config.mine import MineConfig


def test_candidate_timeout_is_the_scaled_baseline_clamped_to_its_bounds() -> None:
    cfg = MineConfig(candidate_timeout_factor=4, candidate_timeout_min_s=30, candidate_timeout_max_s=600)
    assert cfg.candidate_timeout_s(1.0) == 30  # 4 * 1 + 10 = 14, raised to the minimum
    assert cfg.candidate_timeout_s(20.0) == 90  # 4 * 20 + 10
    assert cfg.candidate_timeout_s(1000.0) == 600  # capped


def test_bad_limits_name_the_key() -> None:
    with pytest.raises(ValueError, match="candidate_timeout_min_s .* must not exceed"):
        MineConfig(candidate_timeout_min_s=60, candidate_timeout_max_s=30)
    with pytest.raises(ConfigError, match="mine.test_memory_mb"):
        load_config(None, ["--mine.test_memory_mb", "1"])
    assert load_config(None, ["--mine.git_timeout_s", "5"]).mine.git_timeout_s == 5


def test_the_mine_command_refuses_a_bad_override_and_others_refuse_any(tmp_path, capsys) -> None:
    out = str(tmp_path / "t.jsonl")
    assert main(["tasks", "mine", "--dir", f"x={tmp_path}", "--out", out, "--mine.git_timeout_s", "0"]) == 2
    assert "mine.git_timeout_s" in capsys.readouterr().err
    assert main(["tasks", "check", out, "--mine.git_timeout_s", "5"]) == 2  # one line, no traceback
    assert "unrecognized arguments: --mine.git_timeout_s" in capsys.readouterr().err
