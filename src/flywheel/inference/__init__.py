"""flywheel.inference."""
