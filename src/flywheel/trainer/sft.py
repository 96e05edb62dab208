"""Mid-training: next-token training on transcripts, the base policy that RL starts from.

    from flywheel.trainer.sft import SFTParams, sft_train
    metrics = sft_train(model, examples, SFTParams(lr=1e-3, num_epochs=3, batch_tokens=8192),
                        progress=lambda step, num_steps, m: print(step, m["loss"]))

`examples` are `(token_ids, loss_mask)` pairs: rendered agent sessions (system, task, assistant turns,
tool observations) with loss mask 1 on the assistant's tokens only, so the model learns to act in the
harness, not to predict tool output. `flywheel midtrain` builds that corpus from sessions solving
synthetic tasks - solved, imperfect and failed attempts mixed, so the base policy has a spread of
behaviour that RL can then sharpen.

Design: the same recipe as any SFT stage (TRL SFTTrainer with completion-only loss, nanochat's
mid-training): examples shuffled per epoch with a seeded generator, packed by padded tokens into
batches of at most `batch_tokens`, token-mean cross-entropy over mask-1 targets of the batch, AdamW
with linear warmup and cosine decay to `min_lr_ratio * lr`, global-norm clipping. Deterministic for a
given seed and example list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flywheel.config import LoraConfig
from flywheel.policy.logprobs import logprobs_from_logits
from flywheel.trainer.lora import apply_lora, merge_and_unload
from flywheel.trainer.train import pack_micro_batches


@dataclass
class SFTParams:
    """Mid-training hyper-parameters (a config section may map onto these one to one)."""

    lr: float = 1e-3  # peak AdamW learning rate
    num_epochs: int = 1  # passes over the examples (ignored when num_steps > 0)
    num_steps: int = 0  # optimizer steps; 0 = derived from num_epochs
    batch_tokens: int = 4096  # padded tokens per optimizer step
    warmup_steps: int = 0  # linear warmup steps
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # 0 = off
    dtype: str = "float32"  # "bfloat16" = autocast over fp32 weights
    seed: int = 0
    pad_token_id: int = 0
    lora: LoraConfig | None = None  # trainer.lora with rank > 0: train adapters only, then fold them into the model

    def check(self) -> None:
        if not (self.lr > 0 and self.batch_tokens >= 2 and self.num_epochs >= 0 and self.num_steps >= 0):
            raise ValueError(f"SFT needs lr > 0, batch_tokens >= 2, num_epochs/num_steps >= 0; got {self}")
        if self.num_epochs == 0 and self.num_steps == 0:
            raise ValueError("SFT needs num_epochs > 0 or num_steps > 0")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"SFT dtype must be 'float32' or 'bfloat16'; got '{self.dtype}'")


def _check_examples(examples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[int]:
    usable = []
    for i, ex in enumerate(examples):
        if not (isinstance(ex, (tuple, list)) and len(ex) == 2):
            raise TypeError(f"example {i} must be a (token_ids, loss_mask) pair")
        ids, mask = ex
        if len(ids) != len(mask):
            raise ValueError(f"example {i} has {len(ids)} tokens but {len(mask)} mask entries; they must be equal")
        if len(ids) >= 2 and any(mask[1:]):
            usable.append(i)
    if not usable:
        raise ValueError("no example has a loss token after its first position; check the loss masks")
    return usable


def lr_at(step: int, num_steps: int, p: SFTParams) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup, then cosine to min_lr_ratio."""
    if p.warmup_steps and step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    span = max(num_steps - p.warmup_steps, 1)
    frac = min(max(step - p.warmup_steps, 0) / span, 1.0)
    return p.lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _epoch_batches(examples, usable: list[int], p: SFTParams, gen: torch.Generator) -> list[list[int]]:
    order = [usable[i] for i in torch.randperm(len(usable), generator=gen).tolist()]
    # packing groups similar lengths (little padding); the batch order is then shuffled again
    groups = pack_micro_batches([len(examples[i][0]) for i in order], p.batch_tokens)
    batches = [[order[j] for j in g] for g in groups]
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in perm]


def _collate(examples, idx: list[int], pad: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = max(len(examples[i][0]) for i in idx)
    ids = torch.full((len(idx), t), pad, dtype=torch.long)
    attn = torch.zeros((len(idx), t), dtype=torch.long)
    mask = torch.zeros((len(idx), t), dtype=torch.bool)
    for b, i in enumerate(idx):
        tok, m = examples[i]
        ids[b, :len(tok)] = torch.as_tensor(list(tok))
        attn[b, :len(tok)] = 1
        mask[b, :len(tok)] = torch.as_tensor([bool(x) for x in m])
    return ids.to(device), attn.to(device), mask[:, 1:].to(device)


def sft_loss(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, target_mask: torch.Tensor,
             dtype: str = "float32") -> torch.Tensor:
    """Token-mean next-token cross-entropy over target positions where target_mask is set."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    lp = logprobs_from_logits(logits, ids[:, 1:])
    m = target_mask.float()
    return -(lp * m).sum() / m.sum().clamp(min=1.0)


def sft_train(model: torch.nn.Module, examples: Sequence[tuple[Sequence[int], Sequence[int]]],
              params: SFTParams | None = None,
              progress: Callable[[int, int, dict[str, float]], None] | None = None) -> dict[str, float]:
    """Train `model` in place; returns {initial_loss, final_loss, num_steps, num_tokens, tokens_per_s, ...}.

    `progress(step, num_steps, metrics)` is called after every optimizer step (1-based step).

    With `params.lora` (rank > 0) only low-rank adapters train (trainer/lora.py) and are folded into the weights at
    the end (W0 + scale * B @ A, the engine's formula), so the caller gets a plain model back, as without LoRA.
    """
    p = params or SFTParams()
    p.check()
    usable = _check_examples(examples)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(p.seed)
    batches_per_epoch = len(pack_micro_batches([len(examples[i][0]) for i in usable], p.batch_tokens))
    num_steps = p.num_steps or p.num_epochs * batches_per_epoch
    use_lora = p.lora is not None and p.lora.rank > 0
    if use_lora:
        assert p.lora is not None
        apply_lora(model, p.lora)
    params_ = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params_, lr=p.lr, betas=(p.betas[0], p.betas[1]), weight_decay=p.weight_decay)
    max_norm = p.grad_clip if p.grad_clip > 0 else float("inf")
    model.train()
    queue: list[list[int]] = []
    losses: list[float] = []
    num_tokens = num_loss_tokens = 0
    t0 = time.perf_counter()
    for step in range(num_steps):
        if not queue:
            queue = _epoch_batches(examples, usable, p, gen)
        idx = queue.pop(0)
        ids, attn, tmask = _collate(examples, idx, p.pad_token_id, device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, num_steps, p)
        loss = sft_loss(model, ids, attn, tmask, p.dtype)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params_, max_norm))
        opt.step()
        losses.append(float(loss.detach()))
        num_tokens += int(attn.sum())
        num_loss_tokens += int(tmask.sum())
        if progress is not None:
            progress(step + 1, num_steps, {"loss": losses[-1], "lr": opt.param_groups[0]["lr"],
                                           "grad_norm": grad_norm})
    model.eval()
    if use_lora:
        merge_and_unload(model)
    elapsed = time.perf_counter() - t0
    k = max(1, min(10, len(losses) // 10))  # smooth the end over up to 10 steps
    return {
        "initial_loss": losses[0],
        "final_loss": sum(losses[-k:]) / k,
        "num_steps": float(num_steps),
        "num_tokens": float(num_tokens),
        "num_loss_tokens": float(num_loss_tokens),
        "train_time_s": elapsed,
        "tokens_per_s": num_tokens / max(elapsed, 1e-9),
        "num_trained_params": float(sum(q.numel() for q in params_)),
    }
