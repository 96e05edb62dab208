"""Train-inference numerics: batch-invariant forward passes (see docs/numerics.md)."""
