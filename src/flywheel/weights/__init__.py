"""flywheel.weights."""
