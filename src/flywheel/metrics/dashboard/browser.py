"""A `flywheel dashboard` child process and Debian's headless Chromium, for the dashboard's tests and benchmark.

    with DashboardProcess(Path("runs")) as server, sync_playwright() as pw:
        context, profile = launch_chromium(pw)
        page = context.new_page(); page.goto(server.url)

Chromium is Debian's package (`make setup` installs it when missing and root); Playwright drives that binary
through `executable_path`, so no browser is ever downloaded. As root on a GPU-less, offline machine it needs
`--no-sandbox --disable-gpu`, and without `--disable-background-networking` and its friends it opens many
connections that are refused. Each launch gets a new empty profile directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("FLYWHEEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch_chromium(playwright):
    """A persistent context (new profile dir) on Debian's chromium; returns (context, profile dir)."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: the browser tests need Debian's chromium "
                           "(`apt-get install -y chromium`; `make setup` does it as root), or FLYWHEEL_CHROMIUM")
    profile = tempfile.mkdtemp(prefix="flywheel-chromium-")
    context = playwright.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
    return context, profile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DashboardProcess:
    """`flywheel dashboard ROOT` in a child process on a free loopback port."""

    def __init__(self, root: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = open(Path(tempfile.mkdtemp()) / "dashboard.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "dashboard", str(root), "--port",
                                      str(self.port), "--poll-s", "0.2", *extra], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the dashboard exited with {self.proc.returncode}: {self.output()}")
            try:
                self.get("api/runs")
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the dashboard did not answer within 60 s: {self.output()}")

    def get(self, path: str, headers: dict | None = None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def __enter__(self) -> DashboardProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
