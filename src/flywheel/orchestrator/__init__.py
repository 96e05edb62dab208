"""flywheel.orchestrator."""
