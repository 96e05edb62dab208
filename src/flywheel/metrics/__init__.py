"""flywheel.metrics."""
