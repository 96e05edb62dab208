"""Simulated users with hidden preferences, through the official `openai` client against the real server.

    task = SuggestionTask(seed=0)
    users = [SimUser("ana", key, task, accept_liked=0.9, accept_other=0.1), ...]
    results = await simulate(base_url, users, num_requests=50, max_tokens=4)       # list[Interaction]
    suite = PreferenceSuite(task, chat_format, tokenizer)                           # the gate's held-out suite

The synthetic task is a next-edit suggestion (Tab): the prompt is a line of code-like text, the model suggests a
few tokens, and the user accepts or rejects. Each user's preference is hidden from the server: a user likes a
suggestion that starts a new word (its first character is a space, ~22 % of the tiny random policy's first-token
mass) and accepts a liked one with probability `accept_liked`, any other with `accept_other`. A poisoned user
(`poison=True`) reports the opposite. The gate's held-out suite scores the same preference without the noise on
prompts drawn from another seed, so it measures what the users want, not what any one of them said.

The feedback call goes through the same client (`client.post("/feedback", ...)`), so every byte the users send
is what a real OpenAI SDK user would send.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from flywheel.online.gate import EvalRecord
from flywheel.policy.chat import ChatFormat
from flywheel.types import Message, SamplingParams

WORDS = ["value", "count", "items", "result", "index", "total", "name", "path", "data", "node", "left", "right",
         "key", "size", "line", "text", "token", "buffer", "state", "config", "parse", "load", "save", "merge"]
OPS = [" = ", " += ", "(", ".append(", " if ", " for ", " in ", " return ", " + ", "[", ".get("]


class SuggestionTask:
    """Prompts (a line of code to continue) and the hidden preference on a suggestion's text."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def prompt(self, rng: random.Random) -> str:
        parts = [rng.choice(WORDS)]
        for _ in range(rng.randint(1, 4)):
            parts += [rng.choice(OPS), rng.choice(WORDS)]
        return "Continue this line:\n" + "".join(parts)

    def prompts(self, n: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [self.prompt(rng) for _ in range(n)]

    @staticmethod
    def liked(text: str) -> bool:
        return text[:1] == " "


class PreferenceSuite:
    """The gate's held-out suite for the suggestion task (gate.EvalSuite): prompts from a seed no user draws."""

    def __init__(self, task: SuggestionTask, chat: ChatFormat, tokenizer: Any, max_new_tokens: int = 4,
                 seed: int = 1_000_003):
        self.task, self.chat, self.tokenizer, self.seed = task, chat, tokenizer, seed
        self._sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens,
                                        stop_token_ids=chat.stop_token_ids)

    @property
    def sampling(self) -> SamplingParams:
        return self._sampling

    def prompts(self, n: int) -> list[list[int]]:
        return [self.chat.render([Message("user", p)]) for p in self.task.prompts(n, self.seed)]

    def score(self, index: int, token_ids: list[int]) -> EvalRecord:
        parsed = self.chat.parse(self.tokenizer.decode(token_ids))
        return EvalRecord(score=float(self.task.liked(parsed.content)), broken_tool_call=bool(parsed.errors))


@dataclass
class SimUser:
    name: str
    key: str
    task: SuggestionTask
    accept_liked: float = 0.9
    accept_other: float = 0.1
    poison: bool = False
    seed: int = 0

    def decide(self, text: str, rng: random.Random) -> str:
        liked = self.task.liked(text)
        if self.poison:
            liked = not liked
        return "accept" if rng.random() < (self.accept_liked if liked else self.accept_other) else "reject"


@dataclass
class Interaction:
    user: str
    poison: bool
    ok: bool
    completion_id: str = ""
    weight_version: int = -1
    text: str = ""
    liked: bool = False
    signal: str = ""
    feedback_ok: bool = False
    latency_ms: float = 0.0
    t_start: float = 0.0
    t_end: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def make_client(base_url: str, key: str, timeout_s: float = 120.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=0)


async def interact(client: openai.AsyncOpenAI, user: SimUser, rng: random.Random, model: str, max_tokens: int,
                   stream: bool = False) -> Interaction:
    """One request, then the user's feedback on it."""
    prompt = user.task.prompt(rng)
    t0 = time.time()
    it = Interaction(user.name, user.poison, False, t_start=t0)
    try:
        if stream:
            text, cid, version = "", "", -1
            async for chunk in await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                    stream=True):
                cid = chunk.id
                version = int((chunk.model_extra or {}).get("weight_version", -1))
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        else:
            resp = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
            text, cid = resp.choices[0].message.content or "", resp.id
            version = int((resp.model_extra or {}).get("weight_version", -1))
    except (openai.OpenAIError, httpx.HTTPError) as err:
        it.error, it.t_end = f"{type(err).__name__}: {err}", time.time()
        return it
    it.t_end = time.time()
    it.ok, it.completion_id, it.weight_version, it.text = True, cid, version, text
    it.latency_ms = (it.t_end - t0) * 1e3
    it.liked = user.task.liked(text)
    it.signal = user.decide(text, rng)
    try:
        await client.post("/feedback", body={"completion_id": cid, "signal": it.signal}, cast_to=httpx.Response)
        it.feedback_ok = True
    except (openai.OpenAIError, httpx.HTTPError) as err:
        it.error = f"feedback: {type(err).__name__}: {err}"
    return it


async def simulate(base_url: str, users: list[SimUser], num_requests: int, model: str, max_tokens: int = 4,
                   concurrency: int = 4, seed: int = 0, stream_every: int = 0) -> list[Interaction]:
    """`num_requests` interactions spread round-robin over `users`, at most `concurrency` at a time."""
    clients = {u.name: make_client(base_url, u.key) for u in users}
    rngs = {u.name: random.Random(f"{seed}-{u.name}") for u in users}
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Interaction:
        u = users[i % len(users)]
        async with sem:
            return await interact(clients[u.name], u, rngs[u.name], model, max_tokens,
                                  stream=bool(stream_every) and i % stream_every == 0)

    try:
        return list(await asyncio.gather(*[one(i) for i in range(num_requests)]))
    finally:
        for c in clients.values():
            await c.close()
