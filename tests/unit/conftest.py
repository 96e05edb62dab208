"""Fixtures shared by unit tests of the agent side (test_chat.py defines its own `chat`)."""

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.tools import tools_for
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import default_corpus, train_tokenizer


@pytest.fixture(scope="session")
def chat():
    """The chat format with the core tools, over a small tokenizer trained once per test session."""
    return ChatFormat(train_tokenizer(default_corpus(300_000), 1024), tools_for(EnvConfig(tools="core")))


@pytest.fixture(autouse=True)
def _fresh_grade_cache():
    """Each test starts with an empty per-process grade cache (envs/grade_cache.py), whatever ran before."""
    from flywheel.envs.grade_cache import GRADE_CACHE

    GRADE_CACHE.clear()
    yield
