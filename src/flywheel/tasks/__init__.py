"""flywheel.tasks: task files and their loaders (loaders.py), the shipped test runner (minitest.py) and the
synthetic task generator (synth/)."""
