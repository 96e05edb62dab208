"""Sequence packing (`trainer.pack_sequences`): several rows concatenated into one sequence per micro-batch.

    packs = pack_by_tokens([len(r) for r in rows_ids], budget_tokens)      # row indices per micro-batch
    ids, pos, unpack = packed_layout([rows_ids[i] for i in packs[0]])        # [1, T], [1, T], [n, Lmax - 1]
    logits = model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False).logits
    lp_rows = logprobs_from_logits(logits[:, :-1], ids[:, 1:])[0, unpack]   # each row's target log-probs

Why: padding a micro-batch to its longest row wastes the difference on every shorter row; agent sessions vary
a lot in length. Packed, a micro-batch holds `budget_tokens` real tokens. The attention stays per row: with
`position_ids` restarting at 0 for each row and no attention mask, transformers builds a block-diagonal causal
mask (masking_utils.find_packed_sequence_indices; only without a KV cache, hence `use_cache=False`), so a row
never attends to its neighbours (tests/unit/test_packing.py); rotary positions restart too. `unpack` gathers each
row's log-probs back into the padded [rows, T] layout the losses use
(positions past a row's end repeat a valid index; the loss mask is 0 there). The position at a row's end, which
predicts the next row's first token, is never gathered. Not for the batch-invariant forward (right padding only).
"""

from __future__ import annotations

import torch


def pack_by_tokens(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Row indices per pack: first-fit over rows longest first, each pack's total ≤ budget_tokens (a longer row
    gets a pack of its own). Deterministic, independent of the world size."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    packs: list[list[int]] = []
    totals: list[int] = []
    for i in order:
        for p, total in enumerate(totals):
            if total + lengths[i] <= budget_tokens:
                packs[p].append(i)
                totals[p] += lengths[i]
                break
        else:
            packs.append([i])
            totals.append(lengths[i])
    return packs


def packed_layout(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [1, T], position_ids [1, T], unpack [n, Lmax - 1]) for rows concatenated in order."""
    ids: list[int] = []
    pos: list[int] = []
    lmax = max(len(r) for r in rows)
    unpack = torch.zeros((len(rows), max(lmax - 1, 1)), dtype=torch.long)
    for j, r in enumerate(rows):
        start = len(ids)
        ids.extend(r)
        pos.extend(range(len(r)))
        n = len(r) - 1
        unpack[j, :n] = torch.arange(start, start + n)
        unpack[j, n:] = start
    return torch.tensor([ids]), torch.tensor([pos]), unpack
