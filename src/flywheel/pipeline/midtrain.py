"""Mid-training: build the policy and teach it the harness on agent transcripts.

    flywheel midtrain configs/demo.toml          # writes <run_dir>/base_model

Next-token training (loss on the assistant's tokens only) over scripted sessions solving training tasks
through the real tools (pipeline/transcripts.py), imperfect and failed attempts mixed in. The result is
the base policy RL starts from; it is saved as a plain HF checkpoint. With a pretrained model (`pretrained`,
from `model.import_from`) training starts from its weights instead of a random preset: a pretrained instruct
model answers a coding task in prose, and the transcripts teach it the harness's tool protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flywheel.config import FlywheelConfig
from flywheel.envs.env import CodingEnv, system_prompt
from flywheel.envs.tools import tools_for
from flywheel.pipeline.summary_transcripts import summary_transcripts
from flywheel.pipeline.transcripts import make_drills, make_transcripts
from flywheel.policy.chat import ChatFormat
from flywheel.policy.model import build_model, load_model, save_model
from flywheel.tasks.synth.long import generate_long_tasks
from flywheel.trainer.sft import SFTParams, sft_train
from flywheel.types import Task


def env_factory(cfg: FlywheelConfig, run_dir: Path):
    cache = run_dir / "cache" / "main"
    return lambda: CodingEnv(cfg.env, cache, cfg.env.sandbox)


@contextmanager
def torch_threads(n: int):
    """Run the block with `n` torch threads (0 = one per core), then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def midtrain(cfg: FlywheelConfig, run_dir: Path, tokenizer, tasks: list[Task],
             on_progress: Callable[[str, int, int], None] | None = None, pretrained: Path | None = None) -> Path:
    """Build `cfg.model` (or load `pretrained`), train it on transcripts, save it to `<run_dir>/base_model`;
    returns that dir."""
    out = run_dir / "base_model"
    if (out / "config.json").exists():
        return out
    chat = ChatFormat(tokenizer, tools_for(cfg.env), cfg.model.tool_format)
    n = cfg.midtrain.num_transcripts
    examples = make_transcripts(tasks, cfg.midtrain, chat, env_factory(cfg, run_dir),
                                on_progress=(lambda i: on_progress("transcripts", i, n)) if on_progress else None)
    m = cfg.midtrain
    if m.summary_transcripts:  # long sessions that summarize (the loop's summary request, answered)
        long = generate_long_tasks(m.summary_transcripts, seed=m.seed, split="train", num_files=m.summary_num_files,
                                   pad_functions=m.summary_pad, kind=m.summary_kind)
        examples += summary_transcripts(long, m.summary_transcripts, chat, env_factory(cfg, run_dir), cfg.rollout,
                                        cfg.model.max_seq_len)
    # Stage 1: bare drills (statement → call, ~70 tokens), dense in the one skill a small model learns slowest
    # (copying a name or a span from the statement into a call); the copy mechanism forms fastest there.
    # Stage 2: whole sessions mixed with drills packed after the session's system prompt and tool list, so
    # copying carries over to the context the policy acts in (bare drills alone copied 3/30 edits in that
    # context; see docs/concepts.md).
    bare = make_drills(tasks, m.num_drills, ChatFormat(tokenizer, [], cfg.model.tool_format), m.seed,
                       copy_fraction=m.copy_drill_fraction) if m.drill_steps else []
    drills = make_drills(tasks, m.num_drills, chat, m.seed + 1, copy_fraction=m.copy_drill_fraction,
                         system=system_prompt(cfg.env), per_sequence=m.drills_per_sequence)
    model = load_model(pretrained, cfg.model.dtype) if pretrained is not None else build_model(
        cfg.model, len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # Nothing else of this job runs while the model trains here (it keeps one torch thread for the RL stage,
    # where the engine's process shares the cores): all cores, 1.25x the tokens/s of one on this 2-core
    # machine. Two jobs side by side want `num_threads = 1` each: two jobs of two OpenMP threads on two
    # cores spin against each other and ran 8x slower here, not 2x.
    with torch_threads(m.num_threads):
        common: dict[str, Any] = dict(lr=m.lr, seed=m.seed, pad_token_id=tokenizer.pad_token_id or 0, warmup_steps=m.warmup_steps,
                                    dtype=cfg.trainer.dtype)  # the RL trainer's compute dtype (bf16: autocast)
        if bare:
            sft_train(model, bare, SFTParams(num_steps=m.drill_steps, batch_tokens=m.drill_batch_tokens, **common),
                      progress=(lambda i, total, _: on_progress("midtrain drills", i, total)) if on_progress else None)
        if examples or drills:
            sft_train(model, examples + drills,
                      SFTParams(num_epochs=m.num_epochs, num_steps=m.num_steps, batch_tokens=m.batch_tokens, **common),
                      progress=(lambda i, total, _: on_progress("midtrain sessions", i, total)) if on_progress else None)
    save_model(model, out)
    tokenizer.save_pretrained(out)
    return out
