"""Mid-training: build the policy and teach it the harness on agent transcripts.

    flywheel midtrain configs/demo.toml          # writes <run_dir>/base_model

Next-token training (loss on the assistant's tokens only) over scripted sessions solving training tasks
through the real tools (pipeline/transcripts.py), imperfect and failed attempts mixed in. The result is
the base policy RL starts from; it is saved as a plain HF checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from flywheel.config import FlywheelConfig
from flywheel.types import Task


def env_factory(cfg: FlywheelConfig, run_dir: Path):
    from flywheel.envs.env import CodingEnv

    cache = run_dir / "cache" / "main"
    return lambda: CodingEnv(cfg.env, cache, cfg.env.sandbox)


def chat_format(tokenizer, env_cfg):
    """The chat format with the tool schemas this env config offers."""
    from flywheel.envs.tools import tools_for
    from flywheel.policy.chat import ChatFormat

    return ChatFormat(tokenizer, tools_for(env_cfg))


def midtrain(cfg: FlywheelConfig, run_dir: Path, tokenizer, tasks: list[Task],
             on_progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Build `cfg.model`, train it on transcripts, save it to `<run_dir>/base_model`; returns that dir."""
    from flywheel.pipeline.transcripts import make_drills, make_transcripts
    from flywheel.policy.model import build_model, save_model
    from flywheel.trainer.sft import SFTParams, sft_train

    out = run_dir / "base_model"
    if (out / "config.json").exists():
        return out
    chat = chat_format(tokenizer, cfg.env)
    n = cfg.midtrain.num_transcripts
    examples = make_transcripts(tasks, cfg.midtrain, chat, env_factory(cfg, run_dir),
                                on_progress=(lambda i: on_progress("transcripts", i, n)) if on_progress else None)
    examples += make_drills(tasks, cfg.midtrain.num_drills, tokenizer, cfg.midtrain.seed)
    model = build_model(cfg.model, len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    if examples:
        params = SFTParams(lr=cfg.midtrain.lr, num_epochs=cfg.midtrain.num_epochs, num_steps=cfg.midtrain.num_steps,
                           batch_tokens=cfg.midtrain.batch_tokens,
                           seed=cfg.midtrain.seed, pad_token_id=tokenizer.pad_token_id or 0,
                           warmup_steps=cfg.midtrain.warmup_steps)
        sft_train(model, examples, params,
                  progress=(lambda i, total, m: on_progress("midtrain", i, total)) if on_progress else None)
    save_model(model, out)
    tokenizer.save_pretrained(out)
    return out
