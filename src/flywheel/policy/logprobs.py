"""Trainer-side token log-probs: log p(x_t | x_<t) of given sequences under the model.

    lp = token_logprobs(model, input_ids, attention_mask, temperature=1.0)   # [B, T-1]

The engine reports the log-prob of each sampled token under the distribution it sampled from
(logits / temperature, then top-p renormalised). With top_p = 1 the two agree up to floating-point
reduction order (batch composition, KV-cache vs full forward); docs/inference.md gives the measured
tolerance. Differentiable: the trainer calls it inside autograd.
"""

from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target] in float32. logits [..., V], targets [...] -> [...]."""
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   temperature: float = 1.0, **forward_kwargs) -> torch.Tensor:
    """Log-probs of input_ids[:, 1:] given their prefixes. input_ids [B, T] -> [B, T-1].

    Right padding is assumed (positions are 0..T-1 for every row), which matches how the engine
    places a prompt and its continuation.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **forward_kwargs)
    return logprobs_from_logits(out.logits[:, :-1], input_ids[:, 1:], temperature)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of softmax(logits / T) at each position, in float32. logits [..., V] -> [...]."""
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
