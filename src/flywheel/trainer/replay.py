"""Router replay for MoE policies: the trainer forward routes each token to the experts the sampler used.

    with router_replay(model, experts) as stats:      # experts: LongTensor [B, T, L, K], -1 = route freely
        logits = model(input_ids).logits
    stats.agreement                                   # fraction of replayed (token, layer) pairs whose own
                                                      # top-k equals the replayed experts
    stats.layer_agreement                             # the same, per MoE layer
    with router_replay(model, experts, apply=False):  # measure the agreement only; the model routes itself
    with record_routing(model) as rec: model(ids)     # rec.experts(): [B*T, L, K], what the model chose

Why: a tiny difference in hidden states (bf16 inference kernels, another batch shape) flips the top-k
of some tokens, and the trainer then computes log-probs through different experts than the ones that
sampled the token - a large, spiky training-inference mismatch ("Rollout Routing Replay", R3, 2025).
Replaying the sampler's choice removes that source. The gate *weights* are still recomputed from the
trainer's router logits - softmax over all experts, gathered at the replayed experts, renormalised
when the model renormalises (`norm_topk_prob`), which equals a softmax restricted to the replayed set
- so the router keeps receiving gradients.

Supports the `*TopKRouter` modules of transformers 5 MoE models (Qwen3-MoE; `forward(h) -> (logits,
scores, indices)`). Layer l is the l-th router in module order. Positions with -1 (prompt and tool
tokens, padding) use the model's own top-k.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The top-k router modules of an MoE model, in layer order."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "weight")]


@dataclass
class ReplayStats:
    num_replayed: int = 0  # (token, layer) pairs routed by replay
    num_agree: int = 0  # ... of which the trainer's own top-k set was the same
    layer_replayed: list[int] = field(default_factory=list)  # per MoE layer, same counts
    layer_agree: list[int] = field(default_factory=list)

    @property
    def layer_agreement(self) -> list[float]:
        return [a / n if n else 1.0 for a, n in zip(self.layer_agree, self.layer_replayed)]

    @property
    def agreement(self) -> float:
        return self.num_agree / self.num_replayed if self.num_replayed else 1.0


def _replayed_forward(router: torch.nn.Module, layer: int, experts_bt: torch.Tensor, stats: ReplayStats,
                      apply: bool = True):
    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        if hidden_states.shape[0] != experts_bt.shape[0]:
            raise ValueError(f"router replay was given experts for {experts_bt.shape[0]} tokens but the forward "
                             f"routes {hidden_states.shape[0]}; replay needs one full forward of [B, T] tokens")
        router_logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
        own = torch.topk(probs, self.top_k, dim=-1).indices  # [N, K]
        replay = experts_bt[:, layer, :]  # [N, K]
        use = (replay >= 0).all(-1)
        indices = torch.where(use[:, None], replay, own) if apply else own
        values = probs.gather(-1, indices)
        if self.norm_topk_prob:
            values = values / values.sum(dim=-1, keepdim=True)
        with torch.no_grad():
            agree = (own.sort(-1).values == replay.sort(-1).values).all(-1) & use
            stats.num_replayed += int(use.sum())
            stats.num_agree += int(agree.sum())
            stats.layer_replayed[layer] += int(use.sum())
            stats.layer_agree[layer] += int(agree.sum())
        return router_logits, values.to(router_logits.dtype), indices

    return types.MethodType(forward, router)


@contextmanager
def router_replay(model: torch.nn.Module, routed_experts: torch.Tensor | None,
                  apply: bool = True) -> Iterator[ReplayStats]:
    """Patch every router of `model` to use `routed_experts` [B, T, L, K] (-1 = own routing) for one forward.
    `apply=False` only counts the agreement (the model routes itself; same results as no patch).

    `None` replays nothing (the context is then a no-op), so callers need no branch for dense models.
    """
    stats = ReplayStats()
    if routed_experts is None:
        yield stats
        return
    routers = moe_routers(model)
    if not routers:
        raise ValueError("router replay needs an MoE model with top-k routers; set trainer.router_replay = false")
    if routed_experts.dim() != 4:
        raise ValueError(f"routed_experts must be [B, T, layers, k]; got shape {tuple(routed_experts.shape)}")
    b, t, num_layers, k = routed_experts.shape
    first: Any = routers[0]  # a TopKRouter: top_k and num_experts are ints, weight a parameter
    if num_layers != len(routers) or k != first.top_k:
        raise ValueError(f"routed_experts has {num_layers} layers x top-{k} but the model has {len(routers)} MoE "
                         f"layers x top-{first.top_k}; the sampler and trainer models differ")
    if int(routed_experts.max()) >= first.num_experts:
        raise ValueError(f"routed expert id {int(routed_experts.max())} >= num_experts {first.num_experts}")
    device = first.weight.device
    experts_bt = routed_experts.reshape(b * t, num_layers, k).to(device=device, dtype=torch.long)
    saved = [r.__dict__.get("forward") for r in routers]
    stats.layer_replayed, stats.layer_agree = [0] * len(routers), [0] * len(routers)
    try:
        for layer, r in enumerate(routers):
            r.forward = _replayed_forward(r, layer, experts_bt, stats, apply)
        yield stats
    finally:
        for r, old in zip(routers, saved):
            if old is None:
                del r.forward
            else:
                r.forward = old


@dataclass
class RoutingRecord:
    per_layer: list[list[torch.Tensor]] = field(default_factory=list)  # [layer][call] -> [N, K]

    def experts(self, call: int = -1) -> torch.Tensor:
        """Experts chosen in one forward (`call`, default the last): LongTensor [N, L, K]."""
        return torch.stack([calls[call] for calls in self.per_layer], dim=1)


@contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[RoutingRecord]:
    """Record the experts every router actually used (replayed or its own) in each forward."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError("record_routing needs an MoE model with top-k routers")
    rec = RoutingRecord(per_layer=[[] for _ in routers])
    handles = [r.register_forward_hook(lambda mod, inp, out, i=i: rec.per_layer[i].append(out[2].detach().clone()))
               for i, r in enumerate(routers)]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
