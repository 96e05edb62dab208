"""Token sampling and the log-prob of the distribution actually sampled from. Pure functions of tensors.

    token, logprob = sample_token(logits_v, temperature=0.7, top_p=0.9, generator=g)

The distribution is softmax(logits / temperature), restricted to the smallest set of most likely tokens
whose mass reaches `top_p` and renormalised; the returned log-prob is of that distribution, which is what
importance-sampling corrections in the trainer need. Greedy (temperature == 0) returns the argmax and its
log-prob under temperature 1 (the trainer's default view). Each request owns a torch.Generator, so a
seeded request samples the same tokens whatever else shares its batch.

How, at a real vocabulary's size (V = 49,152 on 2 CPU cores, per row; `flywheel bench sampling`): a token is
drawn by inverse CDF, one float64 uniform from the generator against the cumulative probabilities (~0.14 ms;
`torch.multinomial` took ~1.0 ms, 66 ms for a decode step of 64 rows, as long as the forward of a 135 M model).
The nucleus is found among the tokens within a log-prob width of the most likely one, widened until their mass
reaches top_p; the vocabulary is sorted whole only when it never does or they are most of it. Row by row, not
batched: one row's [V] float64 fits in the L2 cache, a step's [B, V] does not (measured 5x slower batched).
"""

from __future__ import annotations

import torch

NUCLEUS_WIDTHS = (12.0, 24.0)  # log-prob widths below the most likely token tried for the nucleus before a full sort


def _nucleus(lp: torch.Tensor, top_p: float) -> torch.Tensor:
    """The indices (most likely first) of the smallest set of most likely tokens whose mass (exp lp) reaches top_p.

    The tokens within `width` of the most likely one are a set of most likely tokens, so if their mass reaches
    top_p the nucleus lies among them; they are sorted alone (the same leading values, in the same order, as a
    full sort: the same cumulative sums), else a wider set, else all."""
    top = lp.max()
    for width in (*NUCLEUS_WIDTHS, None):
        cand = None if width is None else torch.nonzero(lp >= top - width).flatten()
        if cand is not None and 2 * cand.numel() > lp.numel():
            cand = None  # a flat distribution: a sort of the whole costs little more
        sorted_lp, order = torch.sort(lp if cand is None else lp[cand], descending=True)
        probs = sorted_lp.exp()
        before = torch.cumsum(probs, dim=0) - probs  # mass of the strictly more likely tokens
        if cand is not None and float(before[-1] + probs[-1]) < top_p:
            continue  # the nucleus reaches past these candidates
        keep = before < top_p
        keep[0] = True
        return order[keep] if cand is None else cand[order[keep]]
    raise AssertionError("unreachable: the last try is the whole vocabulary")


def _distribution(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, token ids): of the whole vocabulary (ids None) without a nucleus, else of the nucleus's tokens
    alone, renormalised over them."""
    lp = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    if top_p >= 1.0:
        return lp, None
    ids = _nucleus(lp, top_p)
    sub = lp[ids]
    return sub - torch.logsumexp(sub, dim=0), ids


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs [V] of the sampling distribution (tokens outside the nucleus get -inf). logits [V]."""
    lp, ids = _distribution(logits, temperature, top_p)
    if ids is None:
        return lp
    return torch.full(logits.shape, float("-inf"), device=lp.device).index_copy_(0, ids, lp)


def draw(lp: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """The index of one token of the distribution exp(lp) [V] (which need not sum to exactly 1), by inverse CDF
    on one float64 uniform. A token of probability 0 is never drawn."""
    cdf = lp.double().exp().cumsum(dim=0)
    x = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    token = min(int(torch.searchsorted(cdf, x[None], right=True)), lp.shape[0] - 1)
    if lp[token] == float("-inf"):  # u * total rounded up to the total: the last token that has mass
        token = int(torch.nonzero(lp > float("-inf")).max())
    return token


def sample_token(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None = None) -> tuple[int, float]:
    """One token from logits [V] and its log-prob under the distribution it was drawn from."""
    if temperature == 0:
        lp = torch.log_softmax(logits.float(), dim=-1)
        token = int(torch.argmax(lp))
        return token, float(lp[token])
    lp, ids = _distribution(logits, temperature, top_p)
    j = draw(lp, generator)
    return (j if ids is None else int(ids[j])), float(lp[j])
