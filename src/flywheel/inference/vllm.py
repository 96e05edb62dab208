"""The vLLM engine: flywheel's Engine contract over a vLLM server (launched here, or attached to).

    engine = VLLMEngine(cfg.inference, model_dir="runs/x/model", log_dir="runs/x")   # inference.type = "vllm"
    async with engine:                                      # launches the server (or attaches: inference.vllm.url)
        gen = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=128))
    engine.sync_weights(7, "runs/x/weights")                # delta path: store -> vLLM workers, verified, in place
    engine.update_weights(7, state_dict)                    # Engine protocol: a full reload of these tensors
    sync = StoreSync("runs/x/weights", engine, cfg.inference.vllm.weight_sync)   # what the node polls

Why so. Token ids go in and come out (vLLM's token-in/token-out `/inference/v1/generate`): no text round trip,
no re-tokenization. Each token's weight version is vLLM's own `weight_versions` spans: the server stamps every
engine step's output with its current label, which `sync_weights` moves (`/update_weight_version`) while
generation is paused, so a request in flight across a swap reports exactly which tokens the old and the new
weights produced. Log-probs are vLLM's `processed_logprobs` (after temperature and top-p: the distribution
actually sampled from). MoE routing comes from `--enable-return-routed-experts` when set in `extra_args`.

Weights: `sync_weights` asks the flywheel worker extension inside vLLM (inference/vllm_worker.py) to fetch,
decode and verify the version while generation goes on, then pauses with `mode=keep` (requests in flight stay
in vLLM's queue with their KV cache), applies the copy in place, relabels the version and resumes. So the
pause is the copy, not the download. The fallback is a full reload (`reload_weights`, vLLM's own loader).

A launched server that dies is restarted (`inference.vllm.max_restarts`) with the newest weights and the
requests that failed are sent again, so no group is lost; an attached server that dies is an error.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import shutil
import threading
import time
import urllib.error
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
from safetensors.torch import save_file

from flywheel.inference.vllm_server import VLLMServer, http_json
from flywheel.types import Generation, SamplingParams
from flywheel.weights.store import StoreError
from flywheel.weights.sync import Subscriber, open_source

log = logging.getLogger(__name__)

_FINISH: dict[str, Literal["stop", "length", "aborted"]] = {"stop": "stop", "length": "length", "abort": "aborted"}


class VLLMError(RuntimeError):
    """The vLLM server failed a call (the message carries its answer)."""


class VLLMEngine:
    """Implements flywheel.inference.base.Engine on one vLLM server."""

    def __init__(self, cfg, *, model_dir: str | Path | None = None, tokenizer_dir: str | Path | None = None,
                 log_dir: str | Path = ".", version: int = 0, max_seq_len: int = 0, name: str = "vllm"):
        self.cfg = cfg
        self.vcfg = cfg.vllm
        self.model_dir = None if model_dir is None else str(model_dir)
        if not self.vcfg.url and self.model_dir is None:
            raise ValueError("a launched vLLM server needs the policy's checkpoint directory (model.path), or set "
                             "inference.vllm.url to attach to a running server")
        self.server = (None if self.vcfg.url else
                       VLLMServer(self.vcfg, str(model_dir), Path(log_dir) / f"{name}.log", max_num_seqs=cfg.max_batch_size,
                                  max_model_len=max_seq_len, tokenizer_dir=tokenizer_dir))
        self.url = self.vcfg.url.rstrip("/")
        self.max_model_len = max_seq_len
        self._version = int(version)
        self._started = False
        self._restore: tuple[str, str] | None = None  # ("store" | "exact", url) or ("reload", checkpoint dir)
        self._lock = threading.Lock()  # one weight change or restart at a time
        self._timeout = aiohttp.ClientTimeout(total=self.vcfg.request_timeout_s)
        self._in_flight = 0
        self._busy_since = 0.0
        self.busy_s = 0.0  # seconds with at least one request in flight
        self.num_restarts = 0
        self.update_log: list[dict] = []

    # ---- lifecycle ---------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def start_sync(self) -> None:
        """Launch (or attach), check the served model and label the served version."""
        if self.server is not None:
            self.url = self.server.start()
        try:
            models = http_json("GET", self.url + "/v1/models", timeout_s=30)
        except (urllib.error.URLError, OSError) as err:
            raise ValueError(f"cannot reach the vLLM server at inference.vllm.url='{self.url}': {err}; start it or "
                             f"fix the URL (or leave inference.vllm.url empty to let flywheel launch one)") from None
        served = {m.get("id"): m for m in models.get("data", [])}
        if self.vcfg.served_model_name not in served:
            raise ValueError(f"the vLLM server at {self.url} serves {sorted(served)}, not "
                             f"inference.vllm.served_model_name='{self.vcfg.served_model_name}': set that key to the "
                             f"served name or attach to the server of the policy")
        self.max_model_len = int(served[self.vcfg.served_model_name].get("max_model_len") or 0) or self.max_model_len
        try:
            http_json("GET", self.url + "/is_paused", timeout_s=30)
        except urllib.error.HTTPError as err:
            raise ValueError(f"the vLLM server at {self.url} lacks the RL endpoints ({err}); start it with "
                             f"VLLM_SERVER_DEV_MODE=1 and the flags of docs/inference.md") from None
        label = http_json("GET", self.url + "/weight_info").get("weight_version")
        if self.vcfg.url and str(label).isdigit() and int(str(label)) != self._version:
            raise ValueError(f"the vLLM server at {self.url} serves weights version {label}, this engine starts "
                             f"at version {self._version}: restart the server from the policy's checkpoint")
        self._relabel(self._version)
        self._started = True

    async def start(self) -> None:
        if not self._started or (self.server is not None and not self.server.alive()):
            await asyncio.to_thread(self.start_sync)

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    def close(self) -> None:
        """Stop a launched server (blocking; for code without an event loop)."""
        if self.server is not None:
            self.server.stop()

    async def __aenter__(self) -> VLLMEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ---- requests ----------------------------------------------------------------------------------

    def request_body(self, prompt_ids: list[int], sp: SamplingParams) -> dict:
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sp).__name__}")
        if not prompt_ids or not all(isinstance(t, int) and t >= 0 for t in prompt_ids):
            raise ValueError("prompt_ids must be a non-empty list of non-negative token ids")
        if not sp.temperature >= 0 or not 0 < sp.top_p <= 1 or sp.max_new_tokens < 1:
            raise ValueError(f"bad sampling parameters {sp}: temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 1")
        room = self.max_model_len - len(prompt_ids) if self.max_model_len else sp.max_new_tokens
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_model_len} "
                             f"tokens (it needs room for at least one generated token); shorten the prompt")
        params = {"temperature": sp.temperature, "top_p": sp.top_p, "max_tokens": min(sp.max_new_tokens, room),
                  "logprobs": 0, "stop_token_ids": list(sp.stop_token_ids), "detokenize": bool(sp.stop),
                  "skip_special_tokens": False}
        if sp.stop:
            params.update(stop=list(sp.stop), include_stop_str_in_output=True)
        if sp.seed is not None:
            params["seed"] = int(sp.seed)
        return {"token_ids": list(prompt_ids), "sampling_params": params, "output_mode": "tokens",
                "model": self.vcfg.served_model_name}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       extra_params: Mapping[str, Any] | None = None) -> Generation:
        """`extra_params`: more vLLM sampling parameters for this request (e.g. `{"min_tokens": 64}`)."""
        body = self.request_body(list(prompt_ids), sampling)
        body["sampling_params"].update(extra_params or {})
        if not self._started:
            await self.start()
        for attempt in range(self.vcfg.max_restarts + 1):
            t0 = time.perf_counter()
            self._enter()
            try:
                async with aiohttp.ClientSession(timeout=self._timeout) as session, \
                        session.post(self.url + "/inference/v1/generate", json=body) as resp:
                    text = await resp.text()
                    if resp.status == 400:
                        raise ValueError(f"the vLLM server refused the request: {text[:500]}")
                    if resp.status != 200:
                        raise VLLMError(f"vLLM /inference/v1/generate answered {resp.status}: {text[:500]}")
                return self.parse(json.loads(text), len(body["token_ids"]), time.perf_counter() - t0)
            except (TimeoutError, aiohttp.ClientConnectionError, VLLMError) as err:
                if not await asyncio.to_thread(self.recover, err) or attempt == self.vcfg.max_restarts:
                    raise VLLMError(f"the vLLM server at {self.url} failed: {err!r}"
                                    + (f"; its log ends with:\n{self.server.log_tail()}" if self.server else "")) from err
            finally:
                self._leave()
        raise AssertionError("unreachable")

    def parse(self, resp: dict, prompt_len: int, wall_s: float) -> Generation:
        choice = resp["choices"][0]
        tokens = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(tokens):
            raise VLLMError(f"vLLM returned {len(tokens)} tokens but {len(content)} log-probs")
        versions = [self._version] * len(tokens)
        for span in choice.get("weight_versions") or []:
            label = str(span["version"])
            if not label.lstrip("-").isdigit():
                raise VLLMError(f"vLLM labelled tokens with weight version '{label}', not a flywheel version")
            for i in range(int(span["start"]), min(int(span["end"]), len(tokens))):
                versions[i] = int(label)
        if tokens and not choice.get("weight_versions"):
            raise VLLMError("vLLM returned no weight_versions; the server is too old (vLLM >= 0.32 reports them)")
        metrics = resp.get("metrics") or {}
        ttft = metrics.get("time_to_first_token_ms")
        return Generation(token_ids=tokens, logprobs=[float(c["logprob"]) for c in content], versions=versions,
                          routed_experts=routed_experts(choice.get("routed_experts"), prompt_len, len(tokens)),
                          finish_reason=_FINISH.get(choice.get("finish_reason"), "length"), prompt_len=prompt_len,
                          ttft_s=ttft / 1e3 if ttft is not None else wall_s)

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.busy_s += time.perf_counter() - self._busy_since

    def recover(self, err: BaseException) -> bool:
        """After a failed request: restart a dead launched server with the newest weights. True = retry."""
        with self._lock:
            if self.server is None:
                return False
            if self.server.healthy():
                return not isinstance(err, VLLMError)  # restarted by another request, or a transient error
            if self.num_restarts >= self.vcfg.max_restarts:
                return False
            self.num_restarts += 1
            self.server.stop()
            self.url = self.server.start()
            self._relabel(0)
            version, self._version = self._version, 0
            if self._restore and self._restore[0] in ("store", "exact"):
                self._sync_locked(version, self._restore[1], self._restore[0] == "exact")
            elif self._restore:
                self._reload_locked(version, self._restore[1])
            return True

    # ---- weights -----------------------------------------------------------------------------------

    def _post(self, path: str, body: dict | None = None, timeout_s: float = 600.0) -> dict:
        try:
            return http_json("POST", self.url + path, body if body is not None else {}, timeout_s)
        except urllib.error.HTTPError as err:
            raise VLLMError(f"vLLM {path} answered {err.code}: {err.read()[:1000].decode(errors='replace')}") from None

    def rpc(self, method: str, *args: str | int) -> list:
        """Call a worker-extension method on every vLLM worker; returns their results."""
        return self._post("/collective_rpc", {"method": method, "args": [str(a) for a in args]})["results"]

    def _relabel(self, version: int) -> None:
        self._post("/update_weight_version", {"new_version": str(version)})

    def pause(self) -> None:
        """No engine step starts until `resume`; requests in flight keep their place and KV cache."""
        self._post("/pause?mode=keep")

    def resume(self) -> None:
        self._post("/resume")

    def sync_weights(self, version: int, store_url: str, *, exact: bool = False) -> dict:
        """Install `version` from the weight store by the delta path; returns the timings (ms).

        `exact`: exactly that version, older ones included (a deploy or rollback that the event log chose,
        online/deploy.py); otherwise the store's newest, at least `version` (the RL loop)."""
        with self._lock:
            return self._sync_locked(int(version), store_url, exact)

    def _sync_locked(self, version: int, store_url: str, exact: bool = False) -> dict:
        t0 = time.perf_counter()
        prep = self.rpc("flywheel_prepare", store_url, version, int(exact))  # no pause: fetch, decode, verify
        version = int(prep[0]["version"])  # exact: `version`; else the store's newest (one published meanwhile too)
        t1 = time.perf_counter()
        self.pause()
        t2 = time.perf_counter()
        try:
            applied = self.rpc("flywheel_apply", version)
            self._relabel(version)
        except VLLMError:
            try:
                self._restore_served_locked()  # still paused: no request runs on a mix of versions
            except VLLMError as undo:
                log.error("vLLM at %s: a failed weight apply could not be undone (%s); restart the server", self.url,
                          undo)
            raise
        finally:
            t3 = time.perf_counter()
            self.resume()
        self._version, self._restore = version, ("exact" if exact else "store", store_url)
        m = {"version": version, "path": prep[0].get("path"), "prepare_ms": (t1 - t0) * 1e3,
             "pause_ms": (time.perf_counter() - t2) * 1e3, "apply_ms": (t3 - t2) * 1e3,
             "num_changed": applied[0].get("num_changed"), "bytes_fetched": prep[0].get("bytes_fetched"),
             "apply_path": applied[0].get("apply_path"),
             "worker": {k: v for k, v in {**prep[0], **applied[0]}.items() if k.endswith("_ms")},
             "total_ms": (time.perf_counter() - t0) * 1e3}
        self.update_log.append(m)
        return m

    def _restore_served_locked(self) -> None:
        """After a failed apply, while generation is paused: the worker may have repacked some changed layers with
        the new version (their old packed values are not kept) or the label may not have moved. Reload the
        launched checkpoint and bring it back to the version this engine reports, the way a restart does."""
        if self.model_dir is None:
            log.error("vLLM at %s failed to apply weights and was not launched from a checkpoint: restart it from the "
                      "policy's checkpoint", self.url)
            return
        served, restore = self._version, self._restore
        self.rpc("flywheel_reload", self.model_dir, 0)
        self._relabel(0)
        if restore is None:  # nothing installed since the checkpoint: it is what serves now
            served = self._version = 0
        elif served != 0 and restore[0] == "reload":
            self.rpc("flywheel_reload", restore[1], served)
        elif served != 0:
            self.rpc("flywheel_prepare", restore[1], served, 1)
            self.rpc("flywheel_apply", served)
        self._relabel(served)
        log.warning("vLLM at %s: a failed weight apply was undone (checkpoint reloaded, version %d restored)",
                    self.url, served)

    def reload_weights(self, version: int, checkpoint_dir: str | Path) -> dict:
        """The plain path: pause, vLLM reloads the whole checkpoint in place, relabel, resume."""
        with self._lock:
            return self._reload_locked(int(version), str(checkpoint_dir))

    def _reload_locked(self, version: int, checkpoint_dir: str) -> dict:
        t0 = time.perf_counter()
        self.pause()
        try:
            done = self.rpc("flywheel_reload", checkpoint_dir, version)
            self._relabel(version)
        finally:
            self.resume()
        self._version, self._restore = version, ("reload", checkpoint_dir)
        m = {"version": version, "path": "reload", "pause_ms": (time.perf_counter() - t0) * 1e3,
             "worker": {"reload_ms": done[0].get("reload_ms")},
             "total_ms": (time.perf_counter() - t0) * 1e3}
        self.update_log.append(m)
        return m

    def update_weights(self, version: int, tensors: Mapping[str, Any]) -> float:
        """Engine protocol: write `tensors` (the full state dict) as a checkpoint beside the log and reload it.
        Returns the pause in ms. The server must share this machine's file system (a launched server does)."""
        if not tensors:
            raise ValueError("update_weights needs a non-empty mapping of state-dict name -> tensor")
        root = (self.server.log_path.parent if self.server else Path(".")) / "vllm-reload" / f"v{int(version)}"
        root.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(root / "model.safetensors"))
        if self.model_dir and (Path(self.model_dir) / "config.json").is_file():
            (root / "config.json").write_bytes((Path(self.model_dir) / "config.json").read_bytes())
        pause_ms = self.reload_weights(version, root)["pause_ms"]
        for old in root.parent.glob("v*"):  # the newest is what a restarted server reloads; older ones go
            if old != root:
                shutil.rmtree(old, ignore_errors=True)
        return pause_ms

    def weight_hashes(self, names: list[str] | None = None) -> dict[str, str]:
        """The manifest hash of each Hugging Face tensor read back from the live vLLM parameters (first worker)."""
        return self.rpc("flywheel_hashes", ",".join(names or []))[0]


def routed_experts(blob: str | None, prompt_len: int, num_tokens: int) -> list[list[list[int]]] | None:
    """vLLM's base64 `.npy` routing [positions, layers, k] -> flywheel's [token][layer][k]: the routing of the
    forward that produced token i is that of input position prompt_len - 1 + i."""
    if not blob:
        return None
    arr = np.load(io.BytesIO(base64.b64decode(blob)))
    start = prompt_len - 1 if arr.shape[0] >= prompt_len - 1 + num_tokens else 0
    return arr[start:start + num_tokens].astype(np.int64).tolist()


class StoreSync:
    """What a node polls for weights when its engine is vLLM: the `Subscriber` surface (poll, metrics,
    version, last_error, start/stop/close), moving the server to the store's newest version.

    weight_sync 'delta': the worker extension pulls from the store itself (`VLLMEngine.sync_weights`);
    'reload': this process pulls and verifies (a `Subscriber`) and the engine reloads the full tensors."""

    def __init__(self, source: str, engine: VLLMEngine, weight_sync: str = "delta", weights_cfg: Any = None):
        self.source_url = str(source)
        self.engine = engine
        self.mode = weight_sync
        self.metrics: list[dict] = []
        self.last_error: Exception | None = None
        self.inner: Subscriber | None
        if weight_sync == "reload":
            self.inner = (Subscriber.from_config(source, engine, weights_cfg) if weights_cfg is not None
                          else Subscriber(source, engine))
        else:
            self.inner = None
            self.source = open_source(source)

    @property
    def version(self) -> int | None:
        return self.engine.version

    def poll(self, target: int | None = None) -> int | None:
        """Move the server to the store's newest version; returns it, or None if nothing new was installed.

        `target`: exactly that version instead, older ones included (the deploy follower of `flywheel serve`,
        online/deploy.py, installs what the event log says serves, rollbacks too)."""
        if self.inner is not None:
            v = self.inner.poll(target)
            self.last_error, self.metrics = self.inner.last_error, self.inner.metrics
            return v
        try:
            versions = self.source.list_versions()
        except (StoreError, OSError) as err:
            self.last_error = err
            return None
        if target is not None:
            if target not in versions:
                self.last_error = StoreError(f"version {target} is not in the store")
                return None
            if target == self.engine.version:
                return None
        elif not versions or versions[-1] <= self.engine.version:
            return None
        want = versions[-1] if target is None else target
        try:
            m = self.engine.sync_weights(want, self.source_url, exact=target is not None)
        except (VLLMError, OSError) as err:
            self.last_error = err
            return None
        self.metrics.append(m)
        self.last_error = None
        return int(m["version"])

    def start(self) -> StoreSync:
        return self

    def stop(self) -> None:
        pass

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
