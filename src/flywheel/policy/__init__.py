"""flywheel.policy."""
