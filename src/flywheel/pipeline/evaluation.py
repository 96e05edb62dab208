"""Evaluate a saved policy on a task set: pass@1 and pass@k, per-task results as JSONL.

    flywheel eval --tasks heldout.jsonl --model runs/demo/base_model --samples 4
    result = evaluate_model(cfg, model_dir, tokenizer, tasks, out_jsonl=Path("eval.jsonl"))

Runs the local engine in this process and the same rollout worker and grader as training, so the
figure measures exactly the behaviour RL optimises.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from flywheel.config import FlywheelConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.tools import tools_for
from flywheel.inference.registry import build_engine
from flywheel.policy.chat import ChatFormat
from flywheel.rollout.evaluate import EvalResult, evaluate
from flywheel.rollout.worker import RolloutWorker
from flywheel.types import Task


async def run_evaluation(cfg: FlywheelConfig, model_dir: Path, tokenizer, tasks: list[Task], cache_dir: Path,
                         on_done: Callable[[dict], None] | None = None, *,
                         worker_cls: type[RolloutWorker] = RolloutWorker,
                         env_cls: type[CodingEnv] = CodingEnv) -> tuple[EvalResult, RolloutWorker]:
    """The evaluation and the worker that ran it. `worker_cls` and `env_cls` let a caller record more than the
    per-task rows (benchmarks/mined_passk.py keeps every session's tool calls) with the same engine and grader."""
    engine = build_engine(cfg, model_dir, tokenizer, log_dir=cache_dir, name="vllm-eval")
    await engine.start()
    try:
        rollout = cfg.rollout.model_copy(update={"temperature": cfg.eval.temperature})
        worker = worker_cls(engine, ChatFormat(tokenizer, tools_for(cfg.env), cfg.model.tool_format),
                            lambda: env_cls(cfg.env, cache_dir, cfg.env.sandbox), rollout)
        k = cfg.eval.num_samples
        result = await evaluate(worker, tasks, num_samples=k, ks=tuple(sorted({1, k})), seed=cfg.seed,
                                on_done=on_done)
        return result, worker
    finally:
        await engine.stop()


def evaluate_model(cfg: FlywheelConfig, model_dir: Path, tokenizer, tasks: list[Task], cache_dir: Path,
                   out_jsonl: Path | None = None, on_done: Callable[[dict], None] | None = None) -> EvalResult:
    result, _ = asyncio.run(run_evaluation(cfg, Path(model_dir), tokenizer, tasks, cache_dir, on_done))
    if out_jsonl is not None:
        out_jsonl.parent.mkdir(parents=True, exist_ok=True)
        out_jsonl.write_text("".join(json.dumps(row) + "\n" for row in result.per_task))
    return result
