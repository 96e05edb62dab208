"""flywheel.trainer."""
