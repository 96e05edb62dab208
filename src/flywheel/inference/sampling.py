"""Token sampling and the log-prob of the distribution actually sampled from. Pure functions of tensors.

    token, logprob = sample_token(logits_v, temperature=0.7, top_p=0.9, generator=g)

The distribution is softmax(logits / temperature), restricted to the smallest set of most likely tokens
whose mass reaches `top_p` and renormalised; the returned log-prob is of that distribution, which is what
importance-sampling corrections in the trainer need. Greedy (temperature == 0) returns the argmax and its
log-prob under temperature 1 (the trainer's default view). Each request owns a torch.Generator, so a
seeded request samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs [V] of the sampling distribution (tokens outside the nucleus get -inf). logits [V]."""
    lp = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    if top_p >= 1.0:
        return lp
    sorted_lp, order = torch.sort(lp, descending=True)
    probs = sorted_lp.exp()
    before = torch.cumsum(probs, dim=0) - probs  # mass of the strictly more likely tokens
    keep_sorted = before < top_p
    keep_sorted[0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(0, order, keep_sorted)
    kept = lp.masked_fill(~keep, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None = None) -> tuple[int, float]:
    """One token from logits [V] and its log-prob under the distribution it was drawn from."""
    if temperature == 0:
        lp = torch.log_softmax(logits.float(), dim=-1)
        token = int(torch.argmax(lp))
        return token, float(lp[token])
    lp = sampling_logprobs(logits, temperature, top_p)
    token = int(torch.multinomial(lp.exp(), 1, generator=generator))
    return token, float(lp[token])
