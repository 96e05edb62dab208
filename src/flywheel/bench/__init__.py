"""Benchmark targets for `flywheel bench <target>`, one module each with `run(args) -> dict`."""
