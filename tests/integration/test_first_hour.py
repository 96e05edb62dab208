"""A new user's first hour, through the real `flywheel` command in subprocesses: a tiny `flywheel train`, then
`eval` and `serve` on its final_model as the README says, and every ordinary mistake answered with one line that
says what to change (exit code 2, no traceback).

    pytest tests/integration/test_first_hour.py -q     # about 2 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = ["--synth.num_train", "8", "--synth.num_heldout", "2", "--midtrain.num_transcripts", "8",
            "--midtrain.num_drills", "8", "--midtrain.num_epochs", "1", "--eval.num_tasks", "2",
            "--trainer.num_steps", "1", "--trainer.batch_size", "2",
            "--orchestrator.drop_uniform_groups", "false"]  # an untrained model earns one reward everywhere


def flywheel(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flywheel.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    """The one-line refusal: exit 2, no traceback, every needle in the line."""
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """`flywheel train configs/debug.toml`, shrunk to one RL step: a finished run with its final_model."""
    work = tmp_path_factory.mktemp("first-hour")
    res = flywheel("train", str(ROOT / "configs/debug.toml"), "--run_dir", str(work / "run"), *TINY_RUN, cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    return work / "run"


@pytest.fixture
def listener():
    """A port another process holds."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_final_model_carries_its_tokenizer_and_eval_and_serve_run_on_it(run_dir, tmp_path):
    final = run_dir / "final_model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in final.iterdir()}
    res = flywheel("eval", "--tasks", str(run_dir / "tasks/heldout.jsonl"), "--model", str(final), "--out",
                   str(tmp_path / "eval.jsonl"), cwd=tmp_path)
    assert res.returncode == 0 and "pass@1:" in res.stdout, res.stderr[-2000:]
    assert len((tmp_path / "eval.jsonl").read_text().splitlines()) == 2

    port_file, key_file = tmp_path / "port.json", tmp_path / "key.txt"
    serve = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "serve", "--model", str(final),
                              "--online.learner.enabled", "false", "--run_dir", str(tmp_path / "serve"),
                              "--online.serve.port", "0", "--port-file", str(port_file), "--key-file", str(key_file)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert serve.poll() is None and time.monotonic() < deadline, serve.stdout.read() if serve.stdout else ""
            time.sleep(0.2)
        port = json.loads(port_file.read_text())["port"]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps({
            "model": "flywheel", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}).encode(),
            headers={"Authorization": f"Bearer {key_file.read_text().strip()}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.load(resp)
        assert body["usage"]["completion_tokens"] >= 1 and body["weight_version"] == 0
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    res = flywheel("keys", "list", "--db", str(tmp_path / "serve/online.db"), cwd=tmp_path)
    assert res.returncode == 0 and "default" in res.stdout


def test_a_run_dir_is_never_silently_reused_with_another_config(run_dir, tmp_path):
    res = flywheel("train", str(ROOT / "configs/debug.toml"), "--run_dir", str(run_dir), *TINY_RUN, cwd=tmp_path)
    refused(res, "already holds a run", "--resume", "--fresh")
    half = tmp_path / "half"  # stages of a run that stopped before RL (no checkpoint yet)
    shutil.copytree(run_dir / "tasks", half / "tasks")
    shutil.copy(run_dir / "config.json", half / "config.json")
    res = flywheel("train", str(ROOT / "configs/debug.toml"), "--run_dir", str(half), *TINY_RUN[:-2],
                   "--synth.num_train", "600", cwd=tmp_path)
    refused(res, "another config", "synth.num_train: 8 → 600", "--fresh")


def test_ordinary_mistakes_are_one_line_naming_what_to_change(run_dir, tmp_path, listener):
    final, heldout = run_dir / "final_model", str(run_dir / "tasks/heldout.jsonl")
    bare = tmp_path / "bare"  # weights without a tokenizer
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(final / name, bare / name)
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken.jsonl"
    broken.write_text(Path(heldout).read_text() + "{not json\n")
    cases = [
        (["eval", "--tasks", "nope.jsonl", "--model", str(final)], ["task file 'nope.jsonl' does not exist"]),
        (["eval", "--tasks", heldout, "--model", "runs/nope"], ["--model runs/nope: no such directory",
                                                                "final_model"]),
        (["eval", "--tasks", heldout, "--model", str(tmp_path / "empty")], ["no config.json"]),
        (["eval", "--tasks", heldout, "--model", str(bare)], ["no tokenizer", "--tokenizer"]),
        (["eval", "--tasks", heldout, "--model", "acme/not-cached"], ["not in the local cache",
                                                                      "flywheel models import"]),
        (["eval", "--tasks", str(broken), "--model", str(final)], ["1 broken task(s)", "line 3", "--skip-broken"]),
        (["train", str(ROOT / "configs/debug.toml"), "--run_dir", str(tmp_path / "r"), "--model.path",
          str(tmp_path / "empty")], ["model.path", "no config.json"]),
        (["train", str(ROOT / "configs/debug.toml"), "--run_dir", str(tmp_path / "r"), "--model.path", str(bare)],
         ["model.path", "no tokenizer", "set tokenizer.path"]),
        (["keys", "list", "--db", str(tmp_path / "typo.db")], ["no event log there"]),
        (["deploy", "status", "--db", str(tmp_path / "typo.db")], ["no event log there"]),
        (["serve", "--model", str(final), "--run_dir", str(tmp_path / "clash"), "--online.learner.enabled", "false",
          "--online.serve.port", str(listener)], ["in use", "--online.serve.port"]),
        (["dashboard", str(run_dir.parent), "--port", str(listener)], ["in use", "--port"]),
        (["env-server", "--port", str(listener)], ["in use", "--port"]),
    ]
    env = {"FLYWHEEL_ENV_TOKEN": "a-long-enough-token", "HF_HUB_CACHE": str(tmp_path / "hf")}
    with ThreadPoolExecutor(3) as pool:  # each is a fresh interpreter importing torch: a few seconds of one core
        results = list(pool.map(lambda case: flywheel(*case[0], cwd=tmp_path, env=env), cases))
    for (_, needles), res in zip(cases, results):
        refused(res, *needles)
    assert not (tmp_path / "typo.db").exists()
    assert not (tmp_path / "clash" / "online.db").exists()  # no key stored that the failed start could not show
    assert not (tmp_path / "r").exists()  # the typo was found before any stage ran


def test_a_hub_id_in_the_local_cache_is_accepted(run_dir, tmp_path):
    """Offline: a Hub id resolves to its snapshot in the HF cache, as `huggingface-cli download` leaves it."""
    repo = tmp_path / "hf" / "models--acme--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    shutil.copytree(run_dir / "final_model", repo / "snapshots" / "0123abcd")
    res = flywheel("eval", "--tasks", str(run_dir / "tasks/heldout.jsonl"), "--model", "acme/tiny", "--limit", "1",
                   "--out", str(tmp_path / "e.jsonl"), cwd=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "hf")})
    assert res.returncode == 0 and "pass@1:" in res.stdout, res.stderr[-2000:]
