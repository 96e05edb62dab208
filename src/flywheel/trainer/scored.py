"""Logits only where the loss reads them: the LM head and the log-softmax at a micro-batch's scored positions.

    keep = scored_positions([r.mask for r in rows])             # padded rows: the positions any row scores
    keep = scored_positions([r.mask for r in rows], unpack)     # packed (packing.py): positions in the one sequence
    out = model(input_ids=ids, use_cache=False, logits_to_keep=keep)   # logits [b, len(keep), V]
    lp, ent = target_logprobs(out.logits, ids, keep, temperature, entropy=True)   # [b, T - 1], 0 elsewhere

Why: an agent trajectory's loss reads the log-probs of the policy's own tokens only; the prompt, the tool
results and the harness's messages (most of its tokens: ~80 % in configs/real.toml's sessions) have loss mask 0.
Computing the head there anyway costs V × hidden multiply-adds per token, forward and backward, in float32 with
`numerics.fp32_lm_head`, plus a [tokens, V] float32 log-softmax and its gradient (49,152 entries per token for
SmolLM2: 2.6 GB per 13,400-token step). transformers' `logits_to_keep` takes the positions as a tensor, so the
decoder runs as before and the head runs on the kept rows only. The log-probs at every other position are 0,
which the loss, the correction weights, the mismatch metrics and the entropy never read (all are masked).

Not for the batch-invariant forward (modeling/batch_invariant.py), whose head must see the same rows as the
engine's: it scores every position. A model whose `forward` has no `logits_to_keep` scores every position too
(`keeps_logits`). Tests: tests/unit/test_scored.py.
"""

from __future__ import annotations

import inspect

import torch

from flywheel.policy.logprobs import entropy_from_logits, logprobs_from_logits


def keeps_logits(model: torch.nn.Module) -> bool:
    """Does the model's (or a peft wrapper's base model's) forward take `logits_to_keep`?"""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def scored_positions(masks: list[list[int]], unpack: torch.Tensor | None = None) -> torch.Tensor:
    """The sorted input positions whose next-token log-prob some row's loss mask reads. `masks[r][j]` is row r's
    mask of the target at j + 1 (predicted at position j); packed, `unpack[r, j]` is that position in the one
    sequence. At least one position, so that a row with nothing to score still runs its head."""
    if unpack is None:
        kept = sorted({j for mask in masks for j, m in enumerate(mask) if m})
    else:
        kept = sorted({int(unpack[r, j]) for r, mask in enumerate(masks) for j, m in enumerate(mask) if m})
    return torch.tensor(kept or [0], dtype=torch.long)


def target_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, keep: torch.Tensor | None, temperature: float,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of input_ids[:, 1:] [b, T - 1] (and the policy's entropy there) from logits at every position
    ([b, T, V], keep None) or at `keep` only ([b, len(keep), V]: 0 at the other positions)."""
    if keep is None:
        lp = logprobs_from_logits(logits[:, :-1], input_ids[:, 1:], temperature)
        return lp, entropy_from_logits(logits[:, :-1], temperature) if entropy else None
    keep = keep.to(logits.device)
    b, t = input_ids.shape
    lp = logprobs_from_logits(logits, input_ids[:, keep + 1], temperature)
    full = lp.new_zeros((b, t - 1)).index_copy(1, keep, lp)
    if not entropy:
        return full, None
    ent = entropy_from_logits(logits, temperature)
    return full, ent.new_zeros((b, t - 1)).index_copy(1, keep, ent)
