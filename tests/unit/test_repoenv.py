"""Environment specs from a project's own metadata (tasks/repoenv.py), their keys, and bad specs."""

import pytest

from flywheel.tasks.repoenv import (
    PYTEST_REQUIREMENT,
    EnvNotReady,
    check_spec,
    env_key,
    python_version,
    ready_env,
    spec_from_dir,
)


def test_spec_reads_pyproject_setup_cfg_setup_py_and_requirement_files(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "acme"\ndependencies = ["attrs>=22", "acme-core"]\n'
        '[project.optional-dependencies]\ntest = ["hypothesis"]\ndocs = ["sphinx"]\n')
    (tmp_path / "setup.cfg").write_text("[options]\ninstall_requires =\n    six\n[options.extras_require]\n"
                                        "testing = freezegun\ndev = black\n")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nDEPS = ['toolz']\n"
                                       "setup(name='acme', install_requires=DEPS, tests_require=['mock'],\n"
                                       "      extras_require={'tests': ['pytest-timeout'], 'doc': ['mkdocs']})\n")
    (tmp_path / "requirements.txt").write_text("# comment\nrequests==2.31.0  # pinned\n-r other.txt\n-e .\n"
                                               "git+https://example.invalid/x.git\n")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text("acme\ncoverage\n")
    spec = spec_from_dir(tmp_path)
    assert spec["name"] == "acme" and spec["python"] == python_version()
    assert spec["requirements"] == sorted(["acme-core", "attrs>=22", "coverage", "freezegun", "hypothesis", "mock",
                                           PYTEST_REQUIREMENT, "pytest-timeout", "requests==2.31.0", "six",
                                           "toolz"])  # not sphinx, black, mkdocs (docs/dev), not acme itself


def test_a_project_pytest_requirement_replaces_the_default(tmp_path):
    (tmp_path / "requirements-test.txt").write_text("pytest>=7\n")
    assert spec_from_dir(tmp_path)["requirements"] == ["pytest>=7"]


def test_key_is_content_addressed():
    a = {"name": "x", "python": python_version(), "requirements": ["b", "a"]}
    b = {"name": "y", "python": python_version(), "requirements": ["a", "b"]}
    assert env_key(a) == env_key(b)  # same requirements in any order, any name: one environment
    assert env_key(a) != env_key({**a, "requirements": ["a"]})


def test_broken_metadata_and_bad_specs_are_clear_errors(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project\nname=")
    with pytest.raises(ValueError, match="pyproject.toml"):
        spec_from_dir(tmp_path)
    with pytest.raises(ValueError, match="pip options"):
        check_spec({"python": python_version(), "requirements": ["--index-url=http://evil"]})
    with pytest.raises(ValueError, match="this run's Python"):
        check_spec({"python": "2.7", "requirements": []})
    with pytest.raises(EnvNotReady, match="flywheel envs build"):
        ready_env({"python": python_version(), "requirements": ["nothing-built"]}, tmp_path / "envs")
