"""flywheel: asynchronous, distributed RL for agentic coding models.

Start with `flywheel --help`; the architecture is in docs/concepts.md.
"""

import os

__version__ = "0.1.0"

# MKL's strict reproducible mode, read once at MKL's first call, so set before anything imports torch:
# batch-invariant mode needs it (with 2+ threads MKL splits some matmuls' reductions by row count).
# Why and what it costs: flywheel/modeling/blas.py.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
