"""flywheel: asynchronous, distributed RL for agentic coding models.

Start with `flywheel --help`; the architecture is in docs/concepts.md.
"""

__version__ = "0.1.0"
