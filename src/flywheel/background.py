"""An asyncio server run from a thread of its own, for callers that are not async (tests, benchmarks, the RL loop).

The weight relay (weights/relay.py) and the environment server (envs/remote_server.py) each have a coroutine that
starts serving and one that stops; `BackgroundLoop` runs the first on a fresh event loop in a daemon thread, keeps
that loop running until `stop()`, then runs the second on it and closes the loop. A start that raises is raised
again in the caller, so a port already in use says so instead of timing out.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any


class BackgroundLoop:
    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[None]],
              timeout_s: float = 30.0) -> Any:
        """Run `start()` on the loop's thread and return its result; `stop()` runs there when `stop` is called."""
        ready = threading.Event()
        outcome: dict[str, Any] = {}

        def main() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                outcome["value"] = loop.run_until_complete(start())
            except BaseException as err:  # handed to the caller, which raises it
                outcome["error"] = err
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(stop())
            loop.close()

        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"{self.name} did not start within {timeout_s:.0f} s")
        if "error" in outcome:
            self._thread.join()
            self._loop = self._thread = None
            raise outcome["error"]
        return outcome["value"]

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """Stop the loop (after its stop coroutine); a no-op when it is not running."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self._loop = self._thread = None
