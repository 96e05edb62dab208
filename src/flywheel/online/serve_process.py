"""`flywheel serve` as a child process on loopback, and the tiny policy it serves: how benchmarks and tests drive
the serving API as a user would, from outside its process.

    model_dir = build_policy(tmp / "model")                   # tiny 2-layer policy + tokenizer, built here
    server = ServerProcess(tmp / "run", model_dir, ["--online.learner.enabled=false"])
    client = openai.OpenAI(base_url=server.base_url, api_key=server.key_file.read_text().strip())
    server.kill()                                              # SIGKILL: what durability tests need; stop() is polite

Why a child process and not the app in this one: what is tested is the command users run (its flags, its port
file, its key file, a restart on the same run directory and database), and SIGKILL must leave nothing lost. Used by
bench/online.py, bench/pool.py, bench/serve_engines.py and tests/integration/test_online_*.py; it sits in online/
because it exercises the server, not one benchmark. `SERVER_ARGS` are the serving settings they all share (a learner
that proposes every 48 events, four new tokens per reply); `extra` flags given later override them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from flywheel.config import ModelConfig
from flywheel.policy.model import build_model, save_model
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer

# `--key=value`: a bare value after an override would be taken for serve's CONFIG argument
SERVER_ARGS = ["--online.serve.port=0", "--online.learner.candidate_every_events=48", "--online.learner.batch_size=8",
               "--online.learner.lr=2e-3", "--online.gate.num_prompts=256", "--online.serve.default_max_tokens=4",
               "--inference.prefix_cache_mb=0"]


def build_policy(out: Path, seed: int = 0) -> Path:
    tok = train_tokenizer(default_corpus(300_000), 1024)
    model = build_model(ModelConfig(preset="tiny", num_layers=2, max_seq_len=512, seed=seed), len(tok),
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    save_model(model, out)
    save_tokenizer(tok, out)
    return out


class ServerProcess:
    """`flywheel serve` in a child process; `kill()` is SIGKILL (tests use it for durability)."""

    def __init__(self, run_dir: Path, model_dir: Path, extra: list[str] | None = None, db_url: str = "",
                 wait: bool = True):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.port_file = run_dir / f"port-{time.monotonic_ns()}.json"
        self.key_file = run_dir / "key.txt"
        cmd = [sys.executable, "-m", "flywheel.cli", "serve", "--model", str(model_dir), f"--run_dir={run_dir}",
               "--port-file", str(self.port_file), "--key-file", str(self.key_file), *SERVER_ARGS, *(extra or [])]
        if db_url:
            cmd += [f"--online.serve.db_url={db_url}"]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.log_path = run_dir / "serve.log"
        self.proc = subprocess.Popen(cmd, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env)
        self.port, self.base_url = 0, ""
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until the server listens (it writes its port file then)."""
        deadline = time.time() + timeout_s
        while not self.port_file.is_file():
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"flywheel serve did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        self.port = json.loads(self.port_file.read_text())["port"]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def status(self, key: str) -> dict:
        return httpx.get(f"{self.base_url}/flywheel/status", headers={"Authorization": f"Bearer {key}"},
                         timeout=30).json()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
