"""flywheel.envs."""
