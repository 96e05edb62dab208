"""flywheel.rollout."""
