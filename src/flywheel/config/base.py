"""The two things every config section shares: the errors a user's mistake raises, and the section base class."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class UserError(ValueError):
    """A mistake in what the user gave (a path, a file, a port, a model directory): the message names what to
    change. The command line prints it as one line and exits 2; any other exception is a bug (a traceback with
    --debug)."""


class ConfigError(UserError):
    """A config a user wrote is wrong; the message says which key and what is allowed."""


class Section(BaseModel):
    """Base for every section: unknown keys are refused, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
