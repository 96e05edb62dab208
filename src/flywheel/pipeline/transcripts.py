"""Agent transcripts for mid-training: scripted sessions run through the real harness and sandbox.

    examples = make_transcripts(tasks, cfg.midtrain, chat, env_factory)    # [(token_ids, loss_mask), ...]

Each transcript is a real session: the scripted actions (the task's known fix, applied with the tools)
execute in a real sandbox and the observations are what the tools returned. Rendering follows the agent
loop exactly (prompt, then per turn: assistant tokens with loss mask 1, observation tokens with mask 0),
so mid-training teaches precisely the format RL samples in. A share of transcripts is imperfect (a detour:
an edit whose old text does not match, or an extra look at the tests, then the fix) and a share fails (the
session submits a wrong fix or none) — the base policy is meant to be decent, not perfect, so RL has
something to sharpen.

Drills complement the transcripts: a task statement followed directly by one argument-carrying tool call
(the file to view, the edit to make), without the system prompt. A whole transcript spends ~90 % of its
tokens on context and only a few on copying a file name or a span from the statement into a call — the one
skill a small model finds hardest. Drills are ~70 tokens each and mostly that skill, so they teach it at a
fraction of the compute.

Copy drills (`midtrain.copy_drill_fraction`): the same statement → call shape with a *random* file, function
and edit (`d7 < tq` should be `tq < d7`, `41` should be `40`, ...). Drills built from the tasks alone let a
small model memorise each task's fix instead of learning to copy — held-out functions then get a plausible
but wrong edit (`-` → `>`). Random spans cannot be memorised, so the only way to fit them is to copy from the
statement, which is what held-out tasks need.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from flywheel.config import MidtrainConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.tools import number_lines
from flywheel.tasks.synth import easy_statement, oracle_actions
from flywheel.types import Message, Task, ToolCall


def _corrupt(text: str, rng: random.Random) -> str:
    """A near miss of `text` (one character changed), as a sloppy model would type it."""
    if not text:
        return "?"
    i = rng.randrange(len(text))
    return text[:i] + ("_" if text[i] != "_" else "-") + text[i + 1:]


def scripted_actions(task: Task, kind: str, rng: random.Random, giveup_share: float = 0.5) -> list[ToolCall]:
    """Tool calls for a session of `kind`: 'oracle', 'detour' or 'failed' (a `giveup_share` of failed sessions
    give up without editing, the rest submit a fix with one character wrong)."""
    calls = oracle_actions(task)
    edit = next((i for i, c in enumerate(calls) if c.name == "str_replace"), None)
    if kind == "detour" and edit is not None:
        miss = calls[edit].arguments
        wrong = ToolCall("str_replace", {"path": miss["path"], "old": _corrupt(miss["old"], rng), "new": miss["new"]})
        detour = [wrong] if rng.random() < 0.5 else [ToolCall("run_tests", {})]
        calls = calls[:edit] + detour + calls[edit:]
    elif kind == "failed" and edit is not None:
        if rng.random() < giveup_share:
            calls = calls[:edit] + calls[edit + 1:]  # gives up without editing
        else:
            args = dict(calls[edit].arguments)
            args["new"] = _corrupt(args["new"], rng)  # a wrong fix
            calls = calls[:edit] + [ToolCall("str_replace", args)] + calls[edit + 1:]
    return calls


def run_script(env, task: Task, calls: list[ToolCall]) -> list[Message]:
    """Execute `calls` one per turn in `env`; the conversation as messages (assistant turns included)."""
    messages = list(env.reset(task))
    for call in calls:
        messages.append(Message(role="assistant", content="", tool_calls=[call]))
        obs, done = env.step([call])
        if done:
            break
        messages.extend(obs)
    return messages


def make_transcripts(tasks: list[Task], cfg: MidtrainConfig, chat, env_factory: Callable[[], CodingEnv],
                     on_progress: Callable[[int], None] | None = None) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(cfg.seed)
    examples = []
    pool = [t for t in tasks if t.solution]
    if not pool:
        raise ValueError("mid-training needs tasks with a known `solution` (synthetic tasks have one)")
    for n in range(cfg.num_transcripts):
        task = pool[n % len(pool)] if n < len(pool) else rng.choice(pool)
        u = rng.random()
        kind = "failed" if u < cfg.failed_fraction else "detour" if u < cfg.failed_fraction + cfg.imperfect_fraction else "oracle"
        env = env_factory()
        try:
            messages = run_script(env, task, scripted_actions(task, kind, rng, cfg.failed_giveup_share))
        finally:
            env.close()
        examples.append(render_transcript(chat, messages))
        if on_progress:
            on_progress(n + 1)
    return examples


_NAMES = ("a", "b", "x", "y", "n", "k", "i", "j", "s", "t", "lo", "hi", "acc", "val", "arr", "idx", "total",
          "count", "item", "res", "cur", "step", "size", "left", "right", "key")
_OPS = ("+", "-", "*", "//", "%", "<", "<=", ">", ">=", "==", "!=", "and", "or")
_FILES = ("core", "calc", "utils", "funcs", "compute", "helpers", "mathops", "logic", "tools", "ops", "lib", "main")


def _name(rng: random.Random) -> str:
    base = rng.choice(_NAMES) if rng.random() < 0.6 else "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                                                 for _ in range(rng.randint(1, 4)))
    return base + (str(rng.randint(0, 9)) if rng.random() < 0.3 else "")


def _operand(rng: random.Random) -> str:
    return str(rng.randint(0, 99)) if rng.random() < 0.35 else _name(rng)


def random_edit(rng: random.Random) -> tuple[str, str]:
    """A random (old, new) pair shaped like a synthetic bug's fix: swapped operands or operator, a constant
    off by one, a dropped `+ 1`."""
    a, b = _operand(rng), _operand(rng)
    op = rng.choice(_OPS)
    kind = rng.randrange(4)
    if kind == 0:
        return f"{a} {op} {b}", f"{b} {op} {a}"
    if kind == 1:
        return f"{a} {op} {b}", f"{a} {rng.choice([o for o in _OPS if o != op])} {b}"
    if kind == 2:
        n = rng.randint(0, 99)
        return str(n), str(n + rng.choice((-1, 1, 2)))
    return f"{a} {op} {b}", f"{a} {op} {b} + 1"


def copy_episode(rng: random.Random) -> list[Message]:
    """A random easy-style statement and the turns that answer it: view the file, the edit (after a view of a
    made-up function holding the old text, or straight away)."""
    path = f"{rng.choice(_FILES)}{rng.choice(['', '_', ''])}{rng.choice(['', str(rng.randint(1, 9))])}.py"
    old, new = random_edit(rng)
    while old == new:
        old, new = random_edit(rng)
    name = f"{_name(rng)}_{_name(rng)}"
    user = Message(role="user", content=easy_statement(path, name, old, new))
    view = _call("view", path=path)
    edit = _call("str_replace", path=path, old=old, new=new)
    u = rng.random()
    if u < 0.2:
        return [user, view]
    if u < 0.5:
        return [user, edit]
    args = ", ".join(dict.fromkeys(_name(rng) for _ in range(rng.randint(1, 3))))
    body = [f"def {name}({args}):", f"    return {old}"] if rng.random() < 0.5 else \
        [f"def {name}({args}):", f"    if {_operand(rng)} > {_operand(rng)}:", f"        return {old}", "    return 0"]
    return [user, view, Message(role="tool", name="view", content=number_lines(body)), edit]


def fix_turns(task: Task) -> list[Message] | None:
    """The known fix of `task` as a session: the statement, the view, the real file, then the edits; None when
    the fix is not a view of a workspace file followed by edits. Drills and the copy probe use it."""
    calls = [c for c in oracle_actions(task) if c.arguments]
    view = next((c for c in calls if c.name == "view"), None)
    edits = [c for c in calls if c.name != "view"]
    path = view.arguments.get("path") if view else None
    if not (view and edits and path in task.files):
        return None
    seen = Message(role="tool", name="view", content=number_lines(task.files[path].splitlines()))
    return [Message(role="user", content=task.problem), _msg(view), seen, *(_msg(c) for c in edits)]


def task_episode(task: Task, rng: random.Random) -> list[Message] | None:
    """The known fix of `task` as drill turns: the view, then (after the real file) the edit; or one of them."""
    calls = [c for c in oracle_actions(task) if c.arguments]
    if not calls:
        return None
    whole = fix_turns(task)
    if whole and rng.random() < 0.6:
        return whole
    return [Message(role="user", content=task.problem), _msg(rng.choice(calls))]


def _call(name: str, **arguments: str) -> Message:
    return _msg(ToolCall(name, arguments))


def _msg(call: ToolCall) -> Message:
    return Message(role="assistant", content="", tool_calls=[call])


def render_transcript(chat, messages: list[Message]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask exactly as the agent loop would have produced them: every assistant turn is
    trained (mask 1), the rest — the prompt, then the observations after each turn — is context (mask 0)."""
    ids: list[int] = []
    mask: list[int] = []
    pending: list[Message] = []
    for m in messages:
        if m.role != "assistant":
            pending.append(m)
            continue
        context = chat.render_observation(pending) if ids else chat.render(pending)
        answer = chat.assistant_tokens(m)
        ids += context + answer
        mask += [0] * len(context) + [1] * len(answer)
        pending = []
    if pending and ids:  # observations after the last turn
        context = chat.render_observation(pending)
        ids += context
        mask += [0] * len(context)
    return ids, mask


def make_drills(tasks: list[Task], num_drills: int, chat, seed: int = 0, copy_fraction: float = 0.0,
                system: str | None = None, per_sequence: int = 1) -> list[tuple[list[int], list[int]]]:
    """`num_drills` drill episodes — from the tasks' known fixes, and a `copy_fraction` share of random copy
    episodes — packed `per_sequence` to an example after the `system` message (when given: the session's
    system prompt and tool list, so the model learns to copy with the context it will have); see the module
    docstring."""
    if per_sequence < 1:
        raise ValueError(f"per_sequence must be >= 1, got {per_sequence}")
    pool = [t for t in tasks if t.solution]
    if not pool and num_drills and copy_fraction < 1.0:
        raise ValueError("drills need tasks with a known `solution` whose fix takes tool arguments")
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    head = [Message(role="system", content=system)] if system is not None else []
    examples, episode = [], 0
    while episode < num_drills:
        messages = list(head)
        for _ in range(min(per_sequence, num_drills - episode)):
            turns = copy_episode(rng) if rng.random() < copy_fraction else \
                task_episode(pool[order[episode % len(pool)]], rng)
            if turns is None:
                raise ValueError("drills need tasks with a known `solution` whose fix takes tool arguments")
            messages += turns
            episode += 1
        examples.append(render_transcript(chat, messages))
    return examples
