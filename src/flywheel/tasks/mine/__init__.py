"""Real-code task mining: real projects, injected bugs, tests that catch them (see mine.py)."""

from flywheel.tasks.mine.mine import MineReport, mine_directory, mine_project

__all__ = ["MineReport", "mine_directory", "mine_project"]
