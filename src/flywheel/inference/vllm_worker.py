"""The flywheel worker extension: vLLM's workers pull verified weights from the flywheel weight store.

    python -m vllm.entrypoints.openai.api_server --model CKPT \\
        --worker-extension-cls flywheel.inference.vllm_worker.FlywheelWorkerExtension   # VLLM_SERVER_DEV_MODE=1
    POST /collective_rpc {"method": "flywheel_prepare", "args": [STORE_URL, "7"]}   # fetch, decode, verify: no pause
                                                        # (args [STORE_URL, "7", "1"]: exactly v7, older included)
    POST /pause?mode=keep; POST /collective_rpc {"method": "flywheel_apply", "args": ["7"]}
    POST /update_weight_version {"new_version": "7"}; POST /resume

`flywheel.inference.vllm.VLLMEngine.sync_weights` runs this sequence; nothing else needs to call it.

Why so. The weights reach vLLM the way they reach every flywheel engine: through the weight store, as
lossless deltas (or an anchor) that the receiver verifies bit for bit (weights/sync.py `Subscriber`, run here
inside each vLLM worker, so no tensor crosses HTTP and a fleet in another region reads its own relay). The
work is split so that the generation pause holds only the copy:

* `flywheel_prepare` fetches and decodes the version into host memory and checks every tensor's sha256
  against the manifest, while vLLM keeps generating. A version whose names, shapes or dtypes do not fit the
  served model is refused here, and nothing is touched.
* `flywheel_apply` (between `/pause?mode=keep` and `/resume`) installs the tensors whose hash changed, layer by
  layer and in place (`place_in_place`): plain parameters get their rows copied; a CPU build keeps linear
  weights only in a packed oneDNN/SGL layout (an empty parameter is left) and embeddings in both, so each
  changed layer is packed again by vLLM's own dispatch from the verified tensors (no vLLM reload, no disk).
  Then every changed tensor kept as a plain parameter is read back and compared bit for bit with the staged
  tensor whose sha256 was checked (equal bits, so the manifest's hash); on a mismatch the old values are
  copied back and the apply is refused. Packed weights cannot be read back: that they behave as a full
  reload's is what the tests and the bench assert (same greedy tokens and log-probs). A layout this vLLM
  build gives no way to rebuild goes through vLLM's layer-wise reload from host memory instead.

vLLM fuses parameters: `q_proj`/`k_proj`/`v_proj` live as row blocks of `qkv_proj`, `gate_proj`/`up_proj` of
`gate_up_proj` (the model's `packed_modules_mapping`, in order), embeddings may be padded to a multiple of 64
rows, and a tied `lm_head.weight` is the embedding itself. `WeightMap` places each Hugging Face tensor in the
right rows of the right parameter. It supports tensor parallel size 1 (a shard of a fused, row-split parameter
would need the rank's slice of every block: not built).

`flywheel_reload` is the plain path: vLLM's own in-place loader reads a whole Hugging Face checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from flywheel.weights.sync import Subscriber
from flywheel.weights.tensors import bits_hash, manifest_hash, to_bits


class WeightMap:
    """Where each Hugging Face tensor of a checkpoint lives in a vLLM model (tensor parallel size 1)."""

    def __init__(self, model: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]):
        self.params = dict(model.named_parameters())
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        # name -> (parameter name, first row, rows)
        self.slots: dict[str, tuple[str, int, int]] = {}
        for name, shape in shapes.items():
            self.slots[name] = self._place(name, tuple(shape), shapes, packed, tied)
        fused: dict[str, int] = {}
        for name, (target, _, rows) in self.slots.items():
            if target != name and name != "lm_head.weight":
                fused[target] = fused.get(target, 0) + rows
        for target, rows in fused.items():  # the blocks must tile the fused parameter exactly
            p = self.params[target]
            if p.numel() and rows != p.shape[0]:
                raise ValueError(f"the tensors packed into vLLM's '{target}' have {rows} rows in all, the parameter "
                                 f"has {p.shape[0]}: the weights are not of the served architecture")

    def _place(self, name: str, shape: tuple[int, ...], shapes: Mapping, packed: dict, tied: bool):
        if name in self.params:
            return name, 0, shape[0] if shape else 0
        if name == "lm_head.weight" and tied and "model.embed_tokens.weight" in self.params:
            return "model.embed_tokens.weight", 0, shape[0]
        parts = name.split(".")
        for fused, shards in packed.items():
            for i, shard in enumerate(shards):
                if shard in parts:
                    k = parts.index(shard)
                    target = ".".join(parts[:k] + [fused] + parts[k + 1:])
                    if target not in self.params:
                        continue
                    offset = 0
                    for prev in shards[:i]:
                        sibling = ".".join(parts[:k] + [prev] + parts[k + 1:])
                        if sibling not in shapes:
                            raise ValueError(f"'{name}' is packed into '{target}' after '{sibling}', which the "
                                             f"weights do not name")
                        offset += shapes[sibling][0]
                    return target, offset, shape[0]
        raise ValueError(f"tensor '{name}' has no place in the served model (vLLM parameters such as "
                         f"{list(self.params)[:3]}); is the server serving the policy's architecture?")

    def check_shared(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Tensors that vLLM keeps in one place (a tied head is the embedding) must be equal bit for bit: else the
        copy would install whichever came last and the read-back would fail after the live weights had changed."""
        seen: dict[tuple[str, int, int], str] = {}
        for name, t in tensors.items():
            other = seen.setdefault(self.slots[name], name)
            if other != name and not same_bits(tensors[other], t):
                raise ValueError(f"'{name}' and '{other}' share vLLM's '{self.slots[name][0]}' (tied weights) but "
                                 f"differ in this version: publish them equal (keep the tie in training) or serve an "
                                 f"untied model")

    def view(self, name: str) -> torch.Tensor:
        """The live rows of parameter storage that hold tensor `name` (a view: writes go into the model)."""
        target, start, rows = self.slots[name]
        return self.params[target].data[start:start + rows]

    def refresh(self, model: torch.nn.Module) -> None:
        """Re-read the parameter objects (a reload or a repack replaces some)."""
        self.params = dict(model.named_parameters())

    def repacked_param(self, target: str) -> bool:
        """True when vLLM parameter `target` is empty because its values live in a kernel layout."""
        return self.params[target].numel() == 0

    def repacked(self, name: str) -> bool:
        """True when vLLM keeps this tensor only in a kernel layout (CPU builds pack linear weights for oneDNN
        and leave an empty parameter): it cannot be copied into or read back in place."""
        return self.params[self.slots[name][0]].numel() == 0

    def check(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        v = self.view(name)
        if self.repacked(name):
            if v.dtype != dtype:
                raise ValueError(f"'{name}' is {dtype} in the weight store but vLLM serves {v.dtype}: publish in the "
                                 f"served dtype or set inference.vllm.dtype to match")
            return
        if tuple(v.shape) != tuple(shape):
            raise ValueError(f"'{name}' has shape {tuple(shape)}; its place in vLLM's '{self.slots[name][0]}' has "
                             f"{tuple(v.shape)}")
        if v.dtype != dtype:
            raise ValueError(f"'{name}' is {dtype} in the weight store but vLLM serves {v.dtype}: publish in the "
                             f"served dtype or set inference.vllm.dtype to match")


def live_hash(view: torch.Tensor, entry: dict | None = None, manifest_format: int = 1) -> str:
    """The hash a manifest records for a live parameter slice's raw bytes: `entry` is the tensor's manifest entry
    (format 2 hashes per-chunk digests, weights/tensors.py); without one, sha256 of the whole tensor (format 1)."""
    bits = to_bits(view.detach().cpu())
    return bits_hash(bits) if entry is None else manifest_hash(bits, entry, manifest_format)


def same_bits(live: torch.Tensor, staged: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads and -0.0 included): the raw bytes compared as integers."""
    if tuple(live.shape) != tuple(staged.shape) or live.dtype != staged.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[live.element_size()]
    return torch.equal(live.detach().reshape(-1).view(ints), staged.to(live.device).reshape(-1).view(ints))


class NoKernelRepack(RuntimeError):
    """A changed tensor lives in a kernel layout that this vLLM build gives no way to rebuild layer by layer."""


def _kernel_dispatch() -> Any:
    """vLLM's CPU GEMM dispatch (packs a linear layer's weight for oneDNN / SGL), or None on other builds.
    Imported here: this module is imported without vLLM too (the unit tests of `WeightMap`)."""
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return None
    return dispatch_cpu_unquantized_gemm


def place_in_place(model: torch.nn.Module, wmap: WeightMap, tensors: Mapping[str, torch.Tensor],
                   changed: list[str], dispatch: Any = None) -> list[str]:
    """Install the `changed` Hugging Face tensors (of the full, verified `tensors`) in the live model, layer by
    layer, without vLLM's reload. Returns the vLLM parameters that were repacked.

    Plain parameters get the changed rows copied in place. A CPU build keeps each linear weight only in a
    kernel layout (the parameter left empty) and embeddings in both: the layer whose weight changed is packed
    again by vLLM's own dispatch (`dispatch_cpu_unquantized_gemm`, what vLLM runs after loading), from the
    fused weight assembled out of the verified tensors (`dispatch`: that function; None = vLLM's, imported).
    Raises `NoKernelRepack` before touching anything when a changed tensor lives in a layout it cannot
    rebuild (the caller falls back to vLLM's reload)."""
    by_target: dict[str, list[str]] = {}
    for n in changed:
        by_target.setdefault(wmap.slots[n][0], []).append(n)
    users: dict[int, list[torch.nn.Module]] = {}  # parameter id -> modules that packed it (tied heads too)
    for m in model.modules():
        w = m._parameters.get("weight") if hasattr(m, "cpu_linear") else None
        if w is not None and w.numel():
            users.setdefault(id(w), []).append(m)
    plan: list[tuple[str, torch.nn.Module, torch.Tensor | None]] = []
    for target in by_target:
        module_name, _, pname = target.rpartition(".")
        module = model.get_submodule(module_name)
        if not wmap.repacked_param(target):
            plan += [(target, m, None) for m in users.get(id(wmap.params[target]), [])]
            continue
        if pname != "weight" or not hasattr(module, "cpu_linear"):
            raise NoKernelRepack(target)
        parts = sorted((start, rows, n) for n, (t, start, rows) in wmap.slots.items()
                       if t == target and n != "lm_head.weight")
        if any(n not in tensors for *_, n in parts) or [p[0] for p in parts] != \
                [sum(p[1] for p in parts[:i]) for i in range(len(parts))]:
            raise NoKernelRepack(target)
        plan.append((target, module, torch.cat([tensors[n] for *_, n in parts]) if len(parts) > 1
                     else tensors[parts[0][2]].clone()))
    dispatch = dispatch or (_kernel_dispatch() if plan else None)
    if dispatch is None and plan:
        raise NoKernelRepack(plan[0][0])
    for target, names in by_target.items():
        if not wmap.repacked_param(target):
            for n in names:
                v = wmap.view(n)
                v.copy_(tensors[n].to(v.device))
    repacked = []
    for target, module, full in plan:
        if full is None:
            dispatch(module, remove_weight=False)  # the weight stays; its packed copy is rebuilt
        else:
            module.weight = torch.nn.Parameter(full, requires_grad=False)
            dispatch(module, remove_weight=True)
            wmap.params[target] = module.weight
            repacked.append(target)
    return repacked


class _Staging:
    """The Subscriber's engine while preparing: validates and keeps the verified tensors, touches nothing."""

    def __init__(self, ext: FlywheelWorkerExtension):
        self.ext = ext
        self.version: int | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.manifest: dict = {}

    def update_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> float:
        wmap = self.ext.flywheel_map({k: tuple(t.shape) for k, t in tensors.items()})
        for name, t in tensors.items():
            wmap.check(name, t.dtype, tuple(t.shape))
        wmap.check_shared(tensors)
        self.version, self.tensors = int(version), dict(tensors)
        return 0.0


class FlywheelWorkerExtension:
    """Mixed into vLLM's Worker class; every public method is callable through `/collective_rpc`.

    Arguments arrive as strings (vLLM's HTTP `/collective_rpc` passes only strings); results are dicts."""

    model_runner: Any  # vLLM's Worker, which this class is mixed into, provides it

    def _fw_state(self) -> dict[str, Any]:
        state: dict[str, Any] | None = getattr(self, "_flywheel", None)
        if state is None:
            state = {"subscriber": None, "url": None, "staging": None, "map": None, "hashes": {}, "version": None}
            self._flywheel = state
        return state

    def _fw_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    def flywheel_map(self, shapes: Mapping[str, tuple[int, ...]]) -> WeightMap:
        st = self._fw_state()
        if st["map"] is None or set(st["map"].slots) != set(shapes):
            st["map"] = WeightMap(self._fw_model(), shapes)
        return st["map"]

    def flywheel_prepare(self, store_url: str, version: str, exact: str = "0") -> dict:
        """Fetch, decode and verify the store's newest version (at least `version`) into host memory; with
        `exact` = "1" exactly `version`, older ones included (a deploy or a rollback chosen by the event log)."""
        t0 = time.perf_counter()
        st = self._fw_state()
        if st["subscriber"] is None or st["url"] != store_url:
            st["staging"] = _Staging(self)
            st["subscriber"] = Subscriber(store_url, st["staging"], streams=8, num_threads=1)
            st["url"] = store_url
        sub, staging = st["subscriber"], st["staging"]
        if exact == "1":
            sub.poll(int(version))  # None when it is prepared already (staging then holds it)
            ok = sub.version == int(version) and staging.version == sub.version
        else:
            sub.poll()
            ok = sub.version is not None and sub.version >= int(version) and staging.version == sub.version
        if not ok:
            raise ValueError(f"weights v{version} could not be prepared from '{store_url}': {sub.last_error}")
        if staging.manifest.get("version") != staging.version:
            staging.manifest = sub.source.read_manifest(staging.version)
        m = dict(sub.metrics[-1]) if sub.metrics else {}
        return {"version": staging.version, "path": m.get("path"), "bytes_fetched": m.get("bytes_fetched"),
                "num_tensors": len(staging.tensors), "fetch_ms": m.get("fetch_ms"), "decode_verify_ms": m.get("apply_ms"),
                "prepare_ms": (time.perf_counter() - t0) * 1e3}

    def flywheel_apply(self, version: str) -> dict:
        """Copy the prepared version into the live parameters, read it back and verify every hash."""
        t0 = time.perf_counter()
        st = self._fw_state()
        staging = st["staging"]
        if staging is None or staging.version != int(version):
            have = None if staging is None else staging.version
            raise ValueError(f"weights v{version} were not prepared (prepared: v{have}); call flywheel_prepare first")
        wmap = st["map"]
        manifest = staging.manifest
        want = {name: t["hash"] for name, t in manifest["tensors"].items()}
        changed = [n for n in staging.tensors if st["hashes"].get(n) != want[n]]
        targets = sorted({wmap.slots[n][0] for n in changed})
        backup = {t: wmap.params[t].data.clone() for t in targets if not wmap.repacked_param(t)}
        with torch.no_grad():
            try:
                repacked = place_in_place(self._fw_model(), wmap, staging.tensors, changed)
                path = "in_place"
            except NoKernelRepack:
                # a kernel layout this vLLM does not let us rebuild: vLLM's own layer-wise reload places and
                # repacks every tensor (from host memory: the verified version, no disk)
                self.model_runner.reload_weights(weights_iterator=iter(list(staging.tensors.items())))
                wmap.refresh(self._fw_model())
                repacked, path = sorted({wmap.slots[n][0] for n in staging.tensors if wmap.repacked(n)}), "reload"
        copy_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        # read-back: every live tensor vLLM keeps as a plain parameter must equal, bit for bit, the staged tensor
        # whose hash was checked against the manifest in flywheel_prepare (so its hash is the manifest's)
        bad = [n for n in changed if not wmap.repacked(n) and not same_bits(wmap.view(n), staging.tensors[n])]
        if bad:
            with torch.no_grad():
                for t, old in backup.items():
                    wmap.params[t].data.copy_(old)
            st["subscriber"], st["staging"], st["hashes"] = None, None, {}  # start over from an anchor
            restored = "the previous weights were restored" if not repacked else \
                "the repacked weights hold the new version: reload the server's checkpoint"
            raise ValueError(f"weights v{version}: {len(bad)} live tensors differ from the verified ones after the "
                             f"copy ({bad[:3]}); {restored}")
        st["hashes"], st["version"], st["manifest"] = want, int(version), manifest
        staging.tensors = {}
        return {"version": int(version), "apply_path": path, "num_changed": len(changed),
                "num_repacked": len(repacked), "num_verified_live": len([n for n in changed if not wmap.repacked(n)]),
                "copy_ms": copy_ms, "verify_ms": (time.perf_counter() - t1) * 1e3,
                "apply_ms": (time.perf_counter() - t0) * 1e3}

    def flywheel_hashes(self, names: str = "") -> dict:
        """The manifest hash of each tensor (Hugging Face names, comma-separated; '' = those of the last version
        applied) read back from the live parameters."""
        st = self._fw_state()
        wmap = st["map"]
        if wmap is None:
            raise ValueError("no flywheel weights were applied yet; the tensor layout is unknown")
        wanted = names.split(",") if names else list(wmap.slots)
        manifest = st.get("manifest") or {"tensors": {}}
        fmt = int(manifest.get("format", 1))
        return {n: live_hash(wmap.view(n), manifest["tensors"].get(n), fmt) for n in wanted if not wmap.repacked(n)}

    def flywheel_reload(self, path: str, version: str) -> dict:
        """The plain path: vLLM's in-place loader reads the whole checkpoint at `path`."""
        t0 = time.perf_counter()
        self.model_runner.reload_weights(weights_path=path)
        st = self._fw_state()
        st["subscriber"], st["staging"], st["hashes"], st["version"] = None, None, {}, int(version)
        st["map"] = None  # the reload may have replaced parameter objects
        return {"version": int(version), "reload_ms": (time.perf_counter() - t0) * 1e3}



