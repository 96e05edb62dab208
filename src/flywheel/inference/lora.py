"""LoRA adapters served merged (W = W0 + scale * B @ A, always from the pristine base W0) or unmerged beside W0.

    merger = AdapterMerger(dict(model.state_dict(keep_vars=True)), dict(model.named_modules()))
    swaps, kept = merger.prepare(tensors, meta)  # validated and merged off the step lock
    merger.commit(swaps, kept, scale, unmerged) # under the engine's step lock: swap each .data, record the adapter
    merger.served                              # the adapter tensors it merged (the subscriber hashes them)
    merger.base_digest()                       # weights/tensors.state_digest of the pristine base

Why merged and from W0: a merged linear costs nothing per token (no second matmul), and computing every version
from the untouched base (kept as the tensor objects the parameters held before the first adapter, no copy) means a
thousand swaps give the same bits as one; subtracting the old adapter would drift in the last bits. The merge is
`modeling/lora.py`'s `merge_lora`, the very function the trainer's batch-invariant forward uses, so in that mode
the engine's log-probs equal the trainer's bit for bit.

Adapter tensor names are `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r] (trainer/lora.py); `<module>`
must have a `<module>.weight` of shape [out, in] here. A module absent from the next adapter goes back to W0. The
manifest's `base_digest` must equal this engine's base, else the adapter is refused (it was trained on other
weights). A full-weights update (`LocalEngine.update_weights`) makes its tensors the new base.

The manifest's `serve` (trainer.lora.serve) picks the form: "unmerged" leaves every weight at W0 and hangs the
factors on the nn.Linear itself (`modeling/lora.ATTACHED`), which the native decoder's projections add as
`scale * (x A^T) B^T`; the HF fallback runner computes through the module's own forward and cannot, so an engine
on it refuses such an adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flywheel.modeling.lora import ATTACHED, merge_lora
from flywheel.weights.tensors import state_digest

SUFFIX_A, SUFFIX_B = ".lora_A", ".lora_B"


class AdapterMerger:
    """The engine's side of a LoRA run: the pristine base of each adapted weight, and the adapter it serves."""

    def __init__(self, params: Mapping[str, torch.Tensor], modules: Mapping[str, torch.nn.Module] | None = None,
                 unmerged_ok: bool = True):
        self.params = params  # name -> the engine's Parameter (its .data is swapped, the object stays)
        self.modules = modules or {}  # name -> the engine's module (an unmerged adapter hangs on its nn.Linear)
        self.unmerged_ok = unmerged_ok  # False: the engine's runner cannot add unmerged factors (HF fallback)
        self.attached: set[str] = set()  # modules that hold unmerged factors now
        self.base: dict[str, torch.Tensor] = {}  # weight name -> W0 (the tensor its parameter held before)
        self.served: dict[str, torch.Tensor] = {}
        self.scale = 0.0
        self._digest: str | None = None

    def base_digest(self) -> str:
        """`state_digest` of the base weights (adapted ones at W0); computed once per base."""
        if self._digest is None:
            state = {n: self.base.get(n, p.data) for n, p in self.params.items()}
            self._digest = state_digest({n: t.detach() for n, t in state.items()})
        return self._digest

    def reset_base(self, names: list[str] | None = None) -> None:
        """After a full-weights update of `names` (None = all): those tensors are the new base."""
        for n in list(self.base) if names is None else names:
            self.base.pop(n, None)
        for m in sorted(self.attached):  # unmerged factors of a linear whose weight was replaced come off
            if names is None or m + ".weight" in names:
                setattr(self.modules[m], ATTACHED, None)
                self.attached.discard(m)
        self._digest = None
        if not self.base and not self.attached:
            self.served, self.scale = {}, 0.0

    def prepare(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> tuple[list, dict]:
        """Validate an adapter and merge it: ([(parameter, merged weight)], the adapter as kept). ValueError naming
        the tensor on any mismatch; nothing is changed."""
        if meta.get("base_digest") and meta["base_digest"] != self.base_digest():
            raise ValueError(f"adapter for base weights {str(meta['base_digest'])[:12]}… but this engine serves "
                             f"{self.base_digest()[:12]}…: load the model the trainer adapts (same weights and dtype)")
        scale = float(meta["scale"])
        unmerged = meta.get("serve") == "unmerged"
        if unmerged and not self.unmerged_ok:
            raise ValueError("an adapter served unmerged (trainer.lora.serve = 'unmerged') needs the native runner, "
                             "which does not cover this model: set trainer.lora.serve = 'merged'")
        modules = sorted({n[:-len(SUFFIX_A)] for n in tensors if n.endswith(SUFFIX_A)})
        names = {m + s for m in modules for s in (SUFFIX_A, SUFFIX_B)}
        if names != set(tensors):
            odd = sorted(set(tensors) ^ names)[:3]
            raise ValueError(f"adapter update: tensors {odd} are not <module>.lora_A / <module>.lora_B pairs")
        swaps, kept = [], {}
        for m in modules:
            wname = m + ".weight"
            param = self.params.get(wname)
            if param is None:
                raise ValueError(f"adapter update: module '{m}' has no weight '{wname}' in this model")
            w0 = self.base.get(wname, param.data)
            a = tensors[m + SUFFIX_A].detach().to(w0.device, copy=True).contiguous()
            b = tensors[m + SUFFIX_B].detach().to(w0.device, copy=True).contiguous()
            if a.dtype != w0.dtype or b.dtype != w0.dtype:
                raise ValueError(f"adapter update: '{m}' factors are {a.dtype}/{b.dtype}, the weight is {w0.dtype}")
            merged = merge_lora(w0, a, b, scale)  # ValueError on shapes that do not fit
            if unmerged and m not in self.modules:
                raise ValueError(f"adapter update: module '{m}' is not a module of this engine's model")
            swaps.append((wname, param, w0, w0 if unmerged else merged))
            kept[m + SUFFIX_A], kept[m + SUFFIX_B] = a, b
        for wname, w0 in self.base.items():  # adapted before, not now: back to W0
            if wname[:-len(".weight")] not in modules:
                swaps.append((wname, self.params[wname], w0, w0))
        return swaps, kept

    def commit(self, swaps: list, kept: dict, scale: float, unmerged: bool = False) -> None:
        """Record the swap the engine just made (under its step lock); an unmerged adapter's factors go onto its
        modules, and those of the one before come off."""
        for name in self.attached:
            setattr(self.modules[name], ATTACHED, None)
        self.attached = set()
        for wname, param, w0, new in swaps:
            param.data = new
            if new is w0:
                self.base.pop(wname, None)
            else:
                self.base[wname] = w0
        if unmerged:
            for m in sorted({n[:-len(SUFFIX_A)] for n in kept if n.endswith(SUFFIX_A)}):
                setattr(self.modules[m], ATTACHED, (kept[m + SUFFIX_A], kept[m + SUFFIX_B], scale))
                self.attached.add(m)
        self.served, self.scale = kept, scale
