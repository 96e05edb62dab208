"""The demo's mid-trained base policy, built once per test session for the tests that check learning.

Mid-training the demo's base is the longest stage (498–550 s on a 2-core Intel CI host, alone), so the tests
that run RL on the demo's config (locally in test_demo_learns.py, on Ray in test_ray.py) share it, and it is
built in the background (build_demo_base.py) while the rest of the suite runs:

* when collection ends, a child process starts the build if any collected test uses `demo_base`; it runs at a
  lower priority (nice 10) and on one torch thread, so the other tests keep the cores they had and the build
  takes the time they leave idle (a lone run, e.g. `pytest tests/integration/test_demo_learns.py`, builds at
  normal priority on every core);
* the tests that use `demo_base` are moved to the end of the run; the fixture waits for the build.

Each test then runs the job with `model.path` pointing at the base.

`FLYWHEEL_DEMO_BASE=DIR` names a base built before (`python tests/integration/build_demo_base.py DIR`; the build
writes DIR/base.json last) and skips the build: for running the learning tests again while changing the loop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from build_demo_base import DEMO_CONFIG

_BUILD = pytest.StashKey["DemoBaseBuild"]()
BUILD_TIMEOUT_S = 1800


@dataclass
class DemoBase:
    model_dir: Path
    tokenizer_dir: Path
    pass1: float  # held-out pass@1 of the base, as the demo's config evaluates it

    def config(self, run_dir: Path, *extra: str):
        """The demo config for a run from this base (`extra`: more `--section.key value` overrides)."""
        from flywheel.config import load_config

        return load_config(str(DEMO_CONFIG), ["--run_dir", str(run_dir), "--model.path", str(self.model_dir),
                                              "--tokenizer.path", str(self.tokenizer_dir), *extra])

    def seed_summary(self, run_dir: Path) -> None:
        """Start `run_dir`'s summary and eval_before.jsonl with the base's scores, so the job skips its own
        eval-before stage."""
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({"pass1_before": self.pass1}) + "\n")
        shutil.copyfile(self.model_dir.parent / "eval_before.jsonl", run_dir / "eval_before.jsonl")


BASE_ENV = "FLYWHEEL_DEMO_BASE"


def _built(root: Path) -> DemoBase:
    pass1 = json.loads((root / "base.json").read_text())["pass1"]
    return DemoBase(root / "base_model", root / "tokenizer", pass1)


class DemoBaseBuild:
    """The background build: a child process in a session of its own, writing into a temporary root."""

    def __init__(self, alone: bool) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="flywheel-demo-base-"))
        extra = [] if alone else ["--nice", "10", "--midtrain.num_threads", "1"]
        with open(self.root / "build.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("build_demo_base.py")),
                                          str(self.root), *extra], stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def result(self) -> DemoBase:
        try:
            rc = self.proc.wait(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"building the demo base took over {BUILD_TIMEOUT_S} s; log: {self._log_tail()}") from None
        if rc != 0 or not (self.root / "base.json").exists():
            raise RuntimeError(f"building the demo base failed (exit {rc}):\n{self._log_tail()}")
        return _built(self.root)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the build and its sandboxes
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def _log_tail(self) -> str:
        return (self.root / "build.log").read_text(errors="replace")[-4000:]


def _uses_base(item) -> bool:
    return "demo_base" in getattr(item, "fixturenames", ())


def _order(item) -> int:
    """0: the rest; 1: the tests on the demo's base; 2: `after_demo_base`, which want both cores to themselves."""
    return 2 if item.get_closest_marker("after_demo_base") else int(_uses_base(item))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_order)  # stable: the tests on the demo's base near the end, each group in its order


def pytest_collection_finish(session):
    users = [item for item in session.items if _uses_base(item)]
    if users and not session.config.option.collectonly and not os.environ.get(BASE_ENV):
        build = DemoBaseBuild(alone=len(users) == len(session.items))
        session.config.stash[_BUILD] = build
        session.config.add_cleanup(build.stop)


@pytest.fixture(scope="session")
def demo_base(request) -> DemoBase:
    given = os.environ.get(BASE_ENV)
    if given:
        if not (Path(given) / "base.json").exists():
            raise RuntimeError(f"{BASE_ENV}={given} holds no built base (no base.json): build it with "
                               f"`python tests/integration/build_demo_base.py {given}` or unset {BASE_ENV}")
        return _built(Path(given))
    return request.config.stash[_BUILD].result()
