"""What callers see of a sandbox: its per-command limits, the result of a command, and its protocol.

    with create_sandbox(base, SandboxLimits(timeout_s=5)) as sb:   # flywheel/sandbox/sandbox.py
        res: ExecResult = sb.run("python -m pytest -q")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from flywheel.config import EnvConfig


@dataclass
class SandboxLimits:
    """Per-command limits. Sizes in MiB, times in seconds; `max_procs` counts every process of the sandbox."""

    cpu_time_s: int = 20
    memory_mb: int = 1024
    max_procs: int = 64
    file_size_mb: int = 64
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("cpu_time_s", "memory_mb", "max_procs", "file_size_mb"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive int (got {v!r})")
        if self.max_procs < 2:
            raise ValueError(f"SandboxLimits.max_procs must be >= 2 so bash can run a command (got {self.max_procs})")
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"SandboxLimits.timeout_s must be a positive number of seconds (got {self.timeout_s!r})")

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> SandboxLimits:
        return cls(cpu_time_s=cfg.cpu_time_s, memory_mb=cfg.memory_mb, max_procs=cfg.max_procs,
                   file_size_mb=cfg.file_size_mb, timeout_s=cfg.command_timeout_s)

    @classmethod
    def for_grading(cls, cfg: EnvConfig) -> SandboxLimits:
        """The limits of a grading run: `grade_timeout_s` of wall clock and at least as much CPU time."""
        return cls(cpu_time_s=max(cfg.cpu_time_s, int(cfg.grade_timeout_s)), memory_mb=cfg.memory_mb,
                   max_procs=cfg.max_procs, file_size_mb=cfg.file_size_mb, timeout_s=cfg.grade_timeout_s)


@dataclass
class ExecResult:
    """The outcome of one command. `returncode` is negative (-signal) when it was killed."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def output(self) -> str:
        """stdout then stderr, for showing to a model."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return self.stdout + "\n" + self.stderr
        return self.stdout + self.stderr


class Sandbox(Protocol):
    kind: str
    workspace: Path  # on the host
    inner_workspace: str  # the same directory as commands inside the sandbox see it

    def run(self, command: str, timeout_s: float | None = None, stdin: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult: ...

    def close(self) -> None: ...
