"""Admission by priority: which queued requests join the running batch at the next decode step.

    queue = AdmissionQueue(max_batch_size=32, max_background_rows=8, max_prefill_tokens=4096,
                           max_background_prefill_tokens=512)
    queue.push(request)                       # request.priority is "user" or "background"
    admitted = queue.admit(running)           # between two decode steps, on the decode thread

One engine serves users and simulated RL rollouts (docs/online.md, "One pool"). Users come first:

* every queued user request is admitted before any background one (FIFO within a priority), and no background
  request is admitted while a user request is still waiting (for a batch slot or for the prefill budget);
* background rows never hold more than `max_background_rows` of the batch, so `max_batch_size -
  max_background_rows` slots are always free for users: a user arriving while rollouts run joins the batch at
  the next step instead of waiting for a rollout's turn to end;
* while users are in the batch, background prompts prefilled in one step stay within
  `max_background_prefill_tokens` (one prompt per step at least): a prefill runs inside the step, so every user
  row waits for it, and an agent's prompt (system, tools, task: hundreds to thousands of tokens) would otherwise
  stall users' decoding for as long as a full prefill budget takes.

Running rows are never preempted. With the reserve above a user never waits for a batch slot held by a
rollout, so preemption would only buy back the cost of sharing decode steps with background rows (which the cap
bounds), at the price of dropping or copying out their KV caches and re-prefilling them later. A request's tokens
do not depend on its priority: priority only decides *when* a request is prefilled, and in batch-invariant mode
(numerics.batch_invariant) a row's numbers do not depend on the rows beside it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, Literal, Protocol, TypeVar

Priority = Literal["user", "background"]
PRIORITIES: tuple[Priority, ...] = ("user", "background")


class Queued(Protocol):
    """What admission reads from a request."""

    priority: Priority
    prompt_ids: list[int]

    @property
    def cancelled(self) -> bool: ...


R = TypeVar("R", bound=Queued)


class AdmissionQueue(Generic[R]):
    """Two FIFO queues (users, background) and the rule that admits from them. Not thread-safe: the engine
    calls it under its own condition lock."""

    def __init__(self, max_batch_size: int, max_background_rows: int | None = None, max_prefill_tokens: int = 4096,
                 max_background_prefill_tokens: int | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        cap = max_batch_size if max_background_rows is None else max_background_rows
        if not 1 <= cap <= max_batch_size:
            raise ValueError(f"max_background_rows must be in [1, max_batch_size={max_batch_size}], got {cap}; "
                             f"the rows it leaves free are reserved for users")
        self.max_batch_size = max_batch_size
        self.max_background_rows = cap
        self.max_prefill_tokens = max_prefill_tokens
        self.max_background_prefill_tokens = (max_prefill_tokens if max_background_prefill_tokens is None
                                              else max_background_prefill_tokens)
        if self.max_background_prefill_tokens < 1:
            raise ValueError(f"max_background_prefill_tokens must be >= 1, got {max_background_prefill_tokens}")
        self.queues: dict[str, deque[R]] = {p: deque() for p in PRIORITIES}

    def push(self, request: R) -> None:
        if request.priority not in self.queues:
            raise ValueError(f"priority must be one of {list(PRIORITIES)}, got {request.priority!r}")
        self.queues[request.priority].append(request)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def waiting(self, priority: Priority) -> int:
        return len(self.queues[priority])

    def drain(self) -> list[R]:
        """Every queued request, users first; the queues are left empty (the engine is stopping)."""
        out = [r for p in PRIORITIES for r in self.queues[p]]
        for q in self.queues.values():
            q.clear()
        return out

    def admit(self, running: Sequence[Queued]) -> list[R]:
        """Pop the requests that join the batch now: users first, then background within its cap (and, with users
        in the batch, within the background prefill budget), all within the batch size and the prefill token budget
        (at least one request when a slot is free)."""
        admitted: list[R] = []
        free = self.max_batch_size - len(running)
        background = sum(r.priority == "background" for r in running)
        budget = self.max_prefill_tokens
        users_in_batch = any(r.priority == "user" for r in running)
        background_budget = self.max_background_prefill_tokens if users_in_batch else budget
        admitted_background = False
        users, rest = self.queues["user"], self.queues["background"]
        for queue in (users, rest):
            if queue is rest and users:
                break  # a user is still waiting: nothing of lower priority goes before it
            while queue and len(admitted) < free:
                r = queue[0]
                if r.cancelled:
                    queue.popleft()
                    continue
                if queue is rest and background >= self.max_background_rows:
                    break
                if admitted and len(r.prompt_ids) > budget:
                    return admitted  # the budget is spent for this step; the rest waits in order
                if queue is rest and admitted_background and len(r.prompt_ids) > background_budget:
                    return admitted
                budget -= len(r.prompt_ids)
                admitted.append(queue.popleft())
                if queue is rest:
                    background += 1
                    background_budget -= len(r.prompt_ids)
                    admitted_background = True
                else:  # a user joins: background prefill is held to its own budget
                    background_budget = min(background_budget, self.max_background_prefill_tokens)
        return admitted
