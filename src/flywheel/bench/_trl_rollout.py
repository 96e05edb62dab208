"""TRL's side of `flywheel bench trl`: flywheel's harness as a `rollout_func` for `trl.GRPOTrainer`.

    rollout = HarnessRollout(cfg, tasks_by_id, chat, cache_dir)       # then GRPOTrainer(..., rollout_func=rollout)

Why: the head-to-head must compare trainers and systems, not harnesses. TRL 1.16's `rollout_func` receives the
step's prompts (here: task ids, each repeated `num_generations` times, consecutive) and returns token ids, the
sampler's log-probs and an `env_mask` (1 on the model's tokens, 0 on tool output), which TRL's GRPO loss honours.
So each group runs as flywheel sessions (rollout/worker.py: the agent loop, the real tools and sandbox, the
grader), and TRL does everything else: group advantages, its GRPO loss, the optimizer step. Generation is
`transformers`' `generate` on the trainer's live model (TRL's own model, no weight sync needed), batched across the
sessions waiting at that moment (`HFBatchEngine`): on CPU, one prompt at a time would handicap TRL.

The reward of each session (flywheel's `Reward.value`) goes to TRL's reward function as the extra field
`flywheel_reward`. The counters (`tokens_sampled`, `tokens_trained`) feed the bench's throughput figures.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch

from flywheel.envs.env import CodingEnv
from flywheel.policy.chat import ChatFormat
from flywheel.rollout.worker import RolloutWorker
from flywheel.types import Generation, Task

BATCH_WAIT_S = 0.02  # how long a request waits for others to share its generate call


class HFBatchEngine:
    """An Engine over a live `transformers` model: concurrent requests are left-padded into one `generate`."""

    def __init__(self, model, pad_token_id: int, version=lambda: 0, bf16: bool = False) -> None:
        self.model, self.pad_token_id, self.version, self.bf16 = model, pad_token_id, version, bf16
        self.pending: list[tuple[list[int], Any, asyncio.Future]] = []
        self.flushing = False
        self.tokens_sampled = 0
        self.generate_s = 0.0

    async def generate(self, prompt_ids, sampling) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((list(prompt_ids), sampling, future))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(BATCH_WAIT_S)
                batch, self.pending = self.pending, []
                try:
                    outs = await asyncio.to_thread(self._generate, batch)
                except Exception as err:  # every waiting session sees the failure (an engine failure)
                    for _, _, fut in batch:
                        fut.set_exception(err)
                    continue
                for (_, _, fut), out in zip(batch, outs):
                    fut.set_result(out)
        finally:
            self.flushing = False

    @torch.no_grad()
    def _generate(self, batch: list[tuple[list[int], Any, asyncio.Future]]) -> list[Generation]:
        t0 = time.perf_counter()
        width = max(len(p) for p, _, _ in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, _, _) in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        s = batch[0][1]  # every session of a run samples alike; the longest budget of the batch
        max_new = max(b[1].max_new_tokens for b in batch)
        stops = set(s.stop_token_ids)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):  # as TRL's own forward passes
                out = self.model.generate(input_ids=ids, attention_mask=attn, do_sample=s.temperature > 0,
                                          temperature=s.temperature or 1.0, top_p=s.top_p, top_k=0,
                                          max_new_tokens=max_new, eos_token_id=list(stops),
                                          pad_token_id=self.pad_token_id, output_logits=True,
                                          return_dict_in_generate=True)
        finally:
            self.model.train(was_training)
        new = out.sequences[:, width:]
        logp = torch.stack(out.logits, dim=1).float()
        if s.temperature > 0:
            logp = logp / s.temperature
        logp = torch.log_softmax(logp, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens = []
        for i, (_, sampling, _) in enumerate(batch):
            row = new[i].tolist()[: sampling.max_new_tokens]
            end = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
            row = row[:end]
            gens.append(Generation(row, logp[i, :end].tolist(), [self.version()] * len(row),
                                   finish_reason="stop" if row and row[-1] in stops else "length"))
            self.tokens_sampled += len(row)
        self.generate_s += time.perf_counter() - t0
        return gens


class HarnessRollout:
    """The `rollout_func`: each run of equal consecutive prompts (a task id) is one group of flywheel sessions."""

    def __init__(self, cfg, tasks_by_id: dict[str, Task], chat: ChatFormat, cache_dir) -> None:
        self.cfg, self.tasks, self.chat, self.cache_dir = cfg, tasks_by_id, chat, cache_dir
        self.tokens_trained = 0
        self.sessions = 0
        self.solved = 0
        self.engine: HFBatchEngine | None = None

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        if self.engine is None:
            pad = self.chat.tokenizer.pad_token_id or 0
            self.engine = HFBatchEngine(trainer.model, pad, lambda: int(trainer.state.global_step),
                                        bf16=bool(trainer.args.bf16))
        runs: list[tuple[str, int]] = []
        for p in prompts:
            key = p if isinstance(p, str) else str(p)
            if runs and runs[-1][0] == key:
                runs[-1] = (key, runs[-1][1] + 1)
            else:
                runs.append((key, 1))
        worker = RolloutWorker(self.engine, self.chat, lambda: CodingEnv(self.cfg.env, self.cache_dir,
                                                                         self.cfg.env.sandbox), self.cfg.rollout)

        async def all_groups():
            return await asyncio.gather(*[worker.run_group(self.tasks[tid], group_size=n, group_id=f"trl/{tid}")
                                          for tid, n in runs])

        groups = asyncio.run(all_groups())
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "flywheel_reward": []}
        end = self.chat.stop_token_ids[0]
        for group in groups:
            for traj in group:
                seg = traj.segments[0] if traj.segments and traj.env_failure is None else None
                first = seg.loss_mask.index(1) if seg is not None and 1 in seg.loss_mask else None
                if seg is None or first is None:  # an environment failure or no sampled token: one empty turn
                    prompt, completion, logprobs, mask, reward = (seg.token_ids if seg else [end]), [end], [0.0], [1], 0.0
                else:
                    prompt, completion = seg.token_ids[:first], seg.token_ids[first:]
                    logprobs, mask = seg.logprobs[first:], seg.loss_mask[first:]
                    reward = float(traj.reward.value) if traj.reward is not None else 0.0
                    self.solved += int(bool(traj.reward and traj.reward.components.get("tests") == 1.0))
                out["prompt_ids"].append(list(prompt))
                out["completion_ids"].append(list(completion))
                out["logprobs"].append([float(x) for x in logprobs])
                out["env_mask"].append(list(mask))
                out["flywheel_reward"].append(reward)
                self.tokens_trained += len(prompt) + len(completion)
                self.sessions += 1
        return out


def flywheel_reward(prompts, completions, flywheel_reward, **kwargs) -> list[float]:
    """TRL's reward function: the grader's reward, computed in the rollout (the `flywheel_reward` field)."""
    return [float(r) for r in flywheel_reward]
