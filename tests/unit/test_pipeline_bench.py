"""`flywheel bench pipeline --set`: config overrides reach both runs; a malformed pair says what to write."""

from pathlib import Path

import pytest

from flywheel.bench.pipeline import _config, _settings
from flywheel.config import ConfigError


def test_set_overrides_both_modes_but_not_the_bench_keys():
    settings = _settings(["trainer.correction=none", "trainer.num_steps=99"])
    for mode in ("sync", "async"):
        cfg = _config(Path("/tmp/unused"), mode, False, "local", settings)
        assert cfg.trainer.correction == "none" and cfg.orchestrator.mode == mode
        assert cfg.trainer.num_steps == 16  # the bench's step count wins: both runs take the same steps


def test_bad_set_pairs_are_refused_with_what_to_write():
    with pytest.raises(SystemExit, match="expected SECTION.KEY=VALUE"):
        _settings(["trainer.correction"])
    with pytest.raises(ConfigError, match="unknown key 'trainer.corection'"):
        _config(Path("/tmp/unused"), "sync", False, "local", _settings(["trainer.corection=none"]))
