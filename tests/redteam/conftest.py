"""Shared fixtures of the red-team suite: the three attacked tasks, built once per session."""

from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.redteam.targets import build_targets, synthetic_targets


@pytest.fixture(scope="session")
def targets(tmp_path_factory):
    return build_targets(tmp_path_factory.mktemp("redteam"))


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    """Eight generated tasks (easy and medium) for the legitimate solutions."""
    return synthetic_targets(8)


@pytest.fixture(scope="session")
def env_cfg():
    return EnvConfig(grade_cache=0)  # every case is graded in a sandbox, never from a cached verdict


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("redteam-cache")
