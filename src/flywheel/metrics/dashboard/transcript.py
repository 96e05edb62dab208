"""A trajectory as a person reads it: turns with their text, tool calls, per-token log-probs, and the verdict.

    decoder = TokenDecoder.for_run(Path("runs/demo"), config)     # the run's tokenizer (None if not found)
    view = transcript_view(traj, decoder, tools=run_tools(config))  # JSON for the page

Why from tokens: a trajectory keeps only what the trainer needs (token ids, loss mask, sampler log-probs and
versions), so the transcript is rebuilt from them: split at the turn markers of the tokenizer's family (ChatML's
`<|im_start|>role\n`, Llama 3's `<|start_header_id|>role<|end_header_id|>`, Mistral's `[INST]`/`[/INST]`/
`[TOOL_RESULTS]`; `TURN_MARKERS`), each turn's role from its header or marker, assistant turns parsed with the
run's own tool-call format (`model.tool_format` of its config, "auto" read off the tokenizer as a run picks it)
against the tools the run's sessions had (`env.tools`), so an unusable call names the tools that session could
call. Each sampled token
keeps its text, log-prob and weight version so the page can colour it, and, for the trajectories the trainer
wrote its recomputed log-probs of (trainer_logprobs.py), Δ log p = trainer − sampler. Byte-level BPE pieces are joined with an
incremental UTF-8 decoder, so a character split across tokens is shown once, on the token that completes it.
Every segment after the first starts from a self-summary: the page marks the boundary.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tokenizers import Tokenizer

from flywheel.config import EnvConfig
from flywheel.envs.tools import TOOLS, tools_for
from flywheel.policy.chat import ENDOFTEXT, IM_END, IM_START
from flywheel.policy.tool_formats import TOOL_FORMAT_NAMES, ToolFormat, build_tool_format
from flywheel.types import Trajectory

_TOOLS_BY_NAME = {t["name"]: t for t in TOOLS}
MAX_TURN_CHARS = 20_000  # longer observations are cut in the view (the file on disk keeps every token)


def run_tools(config: dict[str, Any]) -> dict[str, dict]:
    """The tools (name -> schema) a run's sessions were offered: its config's `env.tools`; all of them when the
    config is missing or does not parse (an older run)."""
    env = config.get("env") if isinstance(config, dict) else None
    try:
        cfg = EnvConfig(tools=env["tools"]) if isinstance(env, dict) and "tools" in env else EnvConfig()
    except ValidationError:
        cfg = EnvConfig()
    return {t["name"]: t for t in tools_for(cfg)}


@dataclass(frozen=True)
class TurnMarkers:
    """How a family's transcript splits into turns, by its added tokens."""

    starts: dict[str, str | None]  # a marker that opens a turn -> its role (None: the header after it names it)
    header_end: str | None  # the marker ending a header (None: its first newline)
    silent: frozenset[str]  # markers that are no text (ends of turns, of the transcript)


TURN_MARKERS = {
    "chatml": TurnMarkers({IM_START: None}, None, frozenset({IM_END, ENDOFTEXT})),
    "llama3": TurnMarkers({"<|start_header_id|>": None}, "<|end_header_id|>",
                          frozenset({"<|eot_id|>", "<|eom_id|>", "<|begin_of_text|>", "<|end_of_text|>"})),
    "mistral": TurnMarkers({"[INST]": "user", "[/INST]": "assistant", "[TOOL_RESULTS]": "tool",
                            "[AVAILABLE_TOOLS]": "tools"}, None,
                           frozenset({"</s>", "<s>", "[/TOOL_RESULTS]", "[/AVAILABLE_TOOLS]"})),
}


def turn_markers(added: set[str]) -> TurnMarkers:
    """The family whose turn markers are among the tokenizer's added tokens (ChatML when none is)."""
    for name in ("llama3", "mistral"):
        if all(m in added for m in TURN_MARKERS[name].starts):
            return TURN_MARKERS[name]
    return TURN_MARKERS["chatml"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte ↔ printable-character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


class TokenDecoder:
    """Token id → bytes for a byte-level BPE tokenizer (added tokens map to their literal text)."""

    def __init__(self, tokenizer: Tokenizer, tool_format: str = "auto"):
        self.tokenizer = tokenizer
        self.special = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        added = set(self.special.values())
        self.markers = turn_markers(added)
        self.starts = {i: self.markers.starts[m] for i, m in self.special.items() if m in self.markers.starts}
        self.header_end = next((i for i, m in self.special.items() if m == self.markers.header_end), None)
        self.silent = {i for i, m in self.special.items() if m in self.markers.silent}
        self.tool_format: ToolFormat = build_tool_format(tool_format if tool_format in TOOL_FORMAT_NAMES else "auto",
                                                         added.__contains__)
        self._cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> TokenDecoder:
        """The decoder of a tokenizer directory (a HF dir with tokenizer.json)."""
        return cls(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")))

    @classmethod
    def for_run(cls, run_dir: Path, config: dict[str, Any]) -> TokenDecoder | None:
        """The tokenizer a run used: `tokenizer.path` from its config, else `<run>/tokenizer`."""
        tok_cfg = config.get("tokenizer")
        tok_cfg = tok_cfg if isinstance(tok_cfg, dict) else {}
        model = config.get("model")
        fmt = model.get("tool_format", "auto") if isinstance(model, dict) else "auto"
        for d in [tok_cfg.get("path"), run_dir / "tokenizer", run_dir / "base_model", run_dir / "final_model"]:
            if d and (Path(d) / "tokenizer.json").is_file():
                try:
                    return cls(Tokenizer.from_file(str(Path(d) / "tokenizer.json")), str(fmt))
                except Exception:  # a corrupt tokenizer.json surfaces as many exception types
                    continue
        return None

    def piece(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            if token_id in self.special:
                b = self.special[token_id].encode()
            else:
                s = self.tokenizer.id_to_token(token_id)
                if s is None:
                    b = f"<unk:{token_id}>".encode()
                elif all(c in _UNICODE_TO_BYTE for c in s):
                    b = bytes(_UNICODE_TO_BYTE[c] for c in s)
                else:  # not a byte-level vocabulary
                    b = self.tokenizer.decode([token_id], skip_special_tokens=False).encode()
            self._cache[token_id] = b
        return b

    def texts(self, token_ids: list[int]) -> list[str]:
        """The text each token adds, joined exactly into the decoded string."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = [dec.decode(self.piece(t)) for t in token_ids]
        if out:
            out[-1] += dec.decode(b"", final=True)
        return out


def _turns(seg, decoder: TokenDecoder, dlogp: list[float | None] | None = None,
           tools: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """Split one segment at its family's turn markers into turns; sampled tokens keep log-prob and version, and
    with `dlogp` (one per sampled token, in order) their Δ log p (trainer − sampler) as a fourth entry."""
    num_sampled = 0
    texts = decoder.texts(seg.token_ids)
    turns: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for i, tid in enumerate(seg.token_ids):
        sampled_after_prompt = seg.loss_mask[i] and cur is not None and cur["role"] != "assistant" \
            and not cur["header"] and not cur["tokens"]
        prompt_after_sampled = not seg.loss_mask[i] and cur is not None and cur["role"] == "assistant" \
            and cur["tokens"] and tid not in decoder.silent and tid not in decoder.starts
        if sampled_after_prompt:  # a family that opens no assistant turn after a tool result (Mistral's)
            cur = {"role": "assistant", "header": False, "text": [], "tokens": []}
            turns.append(cur)
        elif prompt_after_sampled:  # an observation written as a bare block, in no turn of its own
            cur = {"role": "tool", "header": False, "text": [], "tokens": []}
            turns.append(cur)
        if tid in decoder.starts or cur is None:
            role = decoder.starts.get(tid)
            cur = {"role": role or "", "header": tid in decoder.starts and role is None, "text": [], "tokens": []}
            turns.append(cur)
            if tid in decoder.starts:
                continue
        if cur["header"]:  # the role name up to the header's end: its marker, or its newline
            if decoder.header_end is not None:
                if tid == decoder.header_end:
                    cur["header"] = False
                else:
                    cur["role"] += texts[i]
            elif "\n" in texts[i]:
                head, _, rest = texts[i].partition("\n")
                cur["role"] += head
                cur["header"] = False
                if rest:
                    cur["text"].append(rest)
            else:
                cur["role"] += texts[i]
            continue
        if tid not in decoder.silent:  # the end-of-turn token is no text, but when sampled it keeps its log-prob
            cur["text"].append(texts[i])
        if seg.loss_mask[i]:
            tok = [texts[i], round(seg.logprobs[i], 4), seg.versions[i]]
            if dlogp is not None:
                tok.append(dlogp[num_sampled] if num_sampled < len(dlogp) else None)
            num_sampled += 1
            cur["tokens"].append(tok)
        elif cur["tokens"]:
            cur["tokens"].append([texts[i], None, -1])  # not sampled (e.g. a closing token after a cut turn)
    out = []
    for t in turns:
        text = "".join(t["text"]).rstrip("\n")
        if decoder.header_end is not None:
            text = text.lstrip("\n")  # Llama 3's header is followed by a blank line
        if t["header"] or (not text.strip() and not t["tokens"]):
            continue  # a generation prompt (`<|im_start|>assistant\n`) closed unanswered (a summary request)
        role = t["role"].strip() or "?"
        turn: dict[str, Any] = {"role": role, "text": text[:MAX_TURN_CHARS],
                                "truncated": len(text) > MAX_TURN_CHARS}
        if t["tokens"]:
            turn["tokens"] = t["tokens"]
            sampled = [tok[1] for tok in t["tokens"] if tok[1] is not None]
            turn["num_sampled"] = len(sampled)
            turn["mean_logprob"] = round(sum(sampled) / len(sampled), 4) if sampled else None
            deltas = [abs(tok[3]) for tok in t["tokens"] if len(tok) > 3 and tok[3] is not None]
            if deltas:
                turn["max_abs_dlogp"] = max(deltas)
        if role == "assistant":
            parsed = decoder.tool_format.parse(text, _TOOLS_BY_NAME if tools is None else tools)
            turn["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]
            turn["tool_errors"] = [{"kind": e.kind, "message": e.message} for e in parsed.errors]
        out.append(turn)
    return out


def transcript_view(traj: Trajectory, decoder: TokenDecoder | None, trainer: dict[str, Any] | None = None,
                    tools: dict[str, dict] | None = None) -> dict[str, Any]:
    """Everything the transcript page shows, as JSON-ready data. `trainer`: the trajectory's record of
    `trainer_logprobs.jsonl` (its `dlogp` per segment and token, and the trainer `step`), if any; `tools`: the
    session's tools (run_tools; all of them when not given)."""
    dlogps = trainer.get("dlogp") if trainer else None
    reward = traj.reward
    view: dict[str, Any] = {
        "task": traj.task_id, "group": traj.group_id, "env_failure": traj.env_failure,
        "num_turns": traj.num_turns, "num_tool_calls": traj.num_tool_calls, "num_tool_errors": traj.num_tool_errors,
        "reward": None if reward is None else {"value": reward.value, "components": reward.components,
                                               "flags": reward.flags, "tests": reward.tests},
        "timings": traj.timings, "meta": {k: v for k, v in traj.meta.items() if k != "diff"},
        "diff": traj.meta.get("diff"), "min_version": traj.min_version, "segments": [],
        "trainer_step": trainer.get("step") if trainer and dlogps else None}
    for n, seg in enumerate(traj.segments):
        if decoder is None:
            turns = [{"role": "?", "text": "(no tokenizer found for this run: token ids only) "
                      + json.dumps(seg.token_ids[:2000])}]
        else:
            turns = _turns(seg, decoder, dlogps[n] if dlogps and n < len(dlogps) else None, tools)
        view["segments"].append({"index": n, "num_tokens": len(seg.token_ids),
                                 "num_sampled": sum(seg.loss_mask), "after_summary": n > 0, "turns": turns})
    return view


def group_view(trajs: list[tuple[int, Trajectory]], decoder: TokenDecoder | None,
               tools: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """A GRPO group side by side: each member's verdict and its assistant turns (no per-token data)."""
    out = []
    for traj_id, traj in trajs:
        v = transcript_view(traj, decoder, tools=tools)
        turns = [{k: t[k] for k in ("role", "text", "tool_calls", "tool_errors") if k in t}
                 for s in v["segments"] for t in s["turns"] if t["role"] in ("assistant", "tool")]
        out.append({"id": traj_id, "reward": v["reward"], "env_failure": v["env_failure"], "turns": turns,
                    "num_segments": len(v["segments"]), "diff": v["diff"], "meta": v["meta"]})
    return out


def transcript_text(view: dict[str, Any]) -> str:
    """A transcript view as plain text (for trackers): the verdict, then every turn under its role."""
    r = view["reward"]
    head = f"task {view['task']} · group {view['group']} · "
    head += (f"env failure: {view['env_failure']}" if view["env_failure"] else
             "not graded" if r is None else
             f"reward {r['value']:.3g} · tests {sum(v == 'passed' for v in r['tests'].values())}/{len(r['tests'])} "
             f"passed · flags {', '.join(r['flags']) or 'none'}")
    parts = [head]
    for seg in view["segments"]:
        if seg["after_summary"]:
            parts.append(f"=== segment {seg['index']}: context rebuilt from the self-summary ===")
        parts += [f"[{t['role']}]\n{t['text']}" for t in seg["turns"]]
    return "\n\n".join(parts)
