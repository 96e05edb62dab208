"""Config section of real-code task mining (`[mine]`; `flywheel tasks mine`, tasks/mine/, docs/environments.md):
the wall-clock and memory limits of every host command mining runs (sandbox/bounded.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from flywheel.config.base import Section


class MineConfig(Section):
    """Limits of task mining. Every test run, install, download and git command is killed with its whole process
    group past its limit; a candidate bug whose test run times out is rejected (reason `timeout`) and mining goes on."""

    baseline_timeout_s: float = Field(600.0, gt=0, le=86_400, description="seconds the project's suite may take on "
                                      "the original tree (past it the project is skipped with that reason)")
    candidate_timeout_factor: float = Field(4.0, ge=1, le=100, description="a candidate bug's suite run may take "
                                            "this many times the baseline run's seconds, plus 10 s ...")
    candidate_timeout_min_s: float = Field(30.0, gt=0, le=86_400, description="... but never less than this "
                                           "(seconds) ...")
    candidate_timeout_max_s: float = Field(600.0, gt=0, le=86_400, description="... nor more than this (seconds); "
                                           "a candidate past it is rejected with reason `timeout`")
    test_memory_mb: int = Field(8192, ge=64, le=1_048_576, description="address-space limit (RLIMIT_AS, MiB) of each "
                                "test run, for the runner and every process it starts")
    install_timeout_s: float = Field(1800.0, gt=0, le=86_400, description="seconds a per-repository environment's "
                                     "`pip install` may take (past it the build fails with that reason)")
    install_memory_mb: int = Field(8192, ge=64, le=1_048_576, description="address-space limit (MiB) of the "
                                   "environment build (venv creation and pip)")
    download_timeout_s: float = Field(600.0, gt=0, le=86_400, description="seconds `pip download` of a project's "
                                      "source distribution may take")
    git_timeout_s: float = Field(120.0, gt=0, le=86_400, description="seconds one git command on a task repository "
                                 "may take")
    materialise_expected: bool = Field(True, description="write a FAIL_TO_PASS test's computed expected value as the "
                                       "literal the reference tree gives it, in a graded copy of its file, so that "
                                       "the test has a twin at grading (envs/expected.py, docs/integrity.md)")

    @model_validator(mode="after")
    def _bounds(self) -> MineConfig:
        if self.candidate_timeout_min_s > self.candidate_timeout_max_s:
            raise ValueError(f"mine.candidate_timeout_min_s ({self.candidate_timeout_min_s}) must not exceed "
                             f"mine.candidate_timeout_max_s ({self.candidate_timeout_max_s})")
        return self

    def candidate_timeout_s(self, baseline_s: float) -> float:
        """The wall-clock limit of one candidate's suite run, given the baseline run's seconds."""
        return min(self.candidate_timeout_max_s,
                   max(self.candidate_timeout_min_s, self.candidate_timeout_factor * baseline_s + 10))
