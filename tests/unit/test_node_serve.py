"""The node process's serve loop (orchestrator/local.py) with a stand-in node: a producer that dies of a bug
is reported to the trainer as an error instead of leaving it waiting for groups forever."""

import asyncio
import queue
from types import SimpleNamespace

from flywheel.orchestrator.local import _serve


class _BrokenNode:
    spec = SimpleNamespace(node_id=3)
    version = 0

    async def start(self):
        pass

    async def produce(self, emit, stop):
        await asyncio.sleep(0.01)
        raise RuntimeError("deque mutated during iteration")

    async def close(self):
        pass

    def stats(self):
        return {}


def test_a_dead_producer_is_reported_not_silent():
    out_q, ctrl_q = queue.Queue(), queue.Queue()

    async def main():
        task = asyncio.ensure_future(_serve(_BrokenNode(), "async", out_q, ctrl_q))
        msg = await asyncio.to_thread(out_q.get, True, 10)
        ctrl_q.put(("stop",))
        await asyncio.wait_for(task, 10)
        return msg

    kind, node_id, text, _ = asyncio.run(main())
    assert (kind, node_id) == ("error", 3) and "deque mutated during iteration" in text
