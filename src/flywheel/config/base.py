"""The two things every config section shares: the error a user's mistake raises, and the section base class."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config a user wrote is wrong; the message says which key and what is allowed."""


class Section(BaseModel):
    """Base for every section: unknown keys are refused, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
