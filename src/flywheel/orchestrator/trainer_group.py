"""A sharded trainer group behind the one handle the loop drives: torchrun (local backend) or Ray actors (ray).

    trainer = build_trainer(cfg, run_dir, base_model_dir)     # trainer.world_size > 1 lands here
    trainer.step(batch); trainer.publish(); trainer.save_checkpoint(state); trainer.close()

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m flywheel.orchestrator.trainer_group \\
        --config C.json --run-dir R --base-model B --address-file A [--resume] [--restarted]

Local backend (`TorchrunTrainer`): the handle starts `torchrun` (a free rendezvous port: `--standalone`), each
rank builds a `TrainerService` over its shards, and rank 0 listens on a localhost socket (authenticated with a
per-launch key) whose port it writes to the address file. The handle sends each call to rank 0; rank 0
broadcasts it to the other ranks over the gloo group, every rank runs it (they are collectives), rank 0 replies.

Ray backend (`RayTrainerGroup`): one `RankActor` per rank in a placement group (one bundle per rank, packed),
as OpenRLHF and verl place theirs; rank 0's actor names a TCP rendezvous, every actor joins it, and the driver
calls each method on all actors at once and keeps rank 0's answer.

A dead rank: torchrun's agent terminates the other ranks when one exits with an error (gloo collectives would
otherwise wait `trainer.dist_timeout_s`); Ray reports the dead actor and the handle kills the rest. Either way
the handle starts a new group that resumes from the newest checkpoint (store versions newer than it are dropped,
as in trainer_service.py), retries the call that met the failure and counts `trainer/restarts`; the loop keeps
its buffer and admitted-group log, so no trajectory is lost (tests/unit/test_trainer_group.py kills a rank).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, BinaryIO

from flywheel.config import FlywheelConfig
from flywheel.orchestrator.forwarding import ForwardingTrainer
from flywheel.orchestrator.trainer_service import TrainerService
from flywheel.trainer.distributed import leave_group

METHODS = ("info", "step", "publish", "publisher_metrics", "flush", "save_checkpoint", "save_model", "close")
AUTHKEY_ENV = "FLYWHEEL_TRAINER_AUTHKEY"


def run_method(service: TrainerService, method: str, args: tuple) -> tuple[str, Any]:
    if method not in METHODS:
        return "error", f"unknown trainer method '{method}'"
    try:
        return "ok", getattr(service, method)(*args)
    except Exception:  # reported to the caller; the group keeps serving
        return "error", traceback.format_exc()


def serve_rank(argv: list[str] | None = None) -> None:
    """One rank under torchrun: build the service; rank 0 serves the handle, the others follow rank 0."""
    p = argparse.ArgumentParser(description="a rank of the sharded trainer (started by TorchrunTrainer)")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--base-model", required=True)
    p.add_argument("--address-file", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--restarted", action="store_true")
    a = p.parse_args(argv)
    config = json.loads(Path(a.config).read_text())
    service = TrainerService(config, a.run_dir, a.base_model, a.resume, restarted=a.restarted)
    group = service.group
    if not group.is_main:
        while True:
            method, args = group.broadcast_object()
            run_method(service, method, args)
            if method == "close":
                return leave_group(group)
    listener = Listener(("127.0.0.1", 0), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    tmp = Path(a.address_file + ".tmp")
    tmp.write_text(json.dumps({"port": listener.address[1], "pid": os.getpid()}))
    tmp.replace(a.address_file)
    conn = listener.accept()
    while True:
        try:
            method, args = conn.recv()
        except EOFError:  # the handle went away: close the group cleanly
            method, args = "close", ()
        group.broadcast_object((method, args))
        reply = run_method(service, method, args)
        if method == "close":
            try:
                conn.send(reply)
            except OSError:
                pass
            return leave_group(group)
        conn.send(reply)


class GroupHandle(ForwardingTrainer):
    """What both launchers share: the loop's interface, call retry after a group failure, restart accounting."""

    def __init__(self, cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, resume: bool):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.base_model_dir = Path(base_model_dir)
        self.max_restarts = cfg.trainer.group_max_restarts
        self.num_restarts = 0
        self._start(resume=resume, restarted=False)
        info = self._call("info")
        self.version, self.store_url, self.extra_state = info["version"], info["store_url"], info["extra_state"]
        self.pids = info["pids"]

    # provided by each launcher
    def _start(self, resume: bool, restarted: bool) -> None:
        raise NotImplementedError

    def _send(self, method: str, args: tuple) -> tuple[str, Any]:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _call(self, method: str, *args: Any) -> Any:
        while True:
            try:
                status, value = self._send(method, args)
            except GroupFailed as err:
                self.num_restarts += 1
                if self.num_restarts > self.max_restarts:
                    self._stop()
                    raise RuntimeError(f"the trainer group failed and was restarted {self.max_restarts} times "
                                       f"(trainer.group_max_restarts): {err}") from err
                self._stop()
                self._start(resume=False, restarted=True)  # resumes from the newest checkpoint, if any
                info = self._send("info", ())[1]
                self.version, self.pids = info["version"], info["pids"]
                continue
            if status == "error":
                raise RuntimeError(f"trainer group: {method} failed on rank 0:\n{value}")
            return value

    def close(self) -> None:
        try:
            self._send("close", ())
        except GroupFailed:
            pass
        finally:
            self._stop()


class GroupFailed(RuntimeError):
    """A rank of the trainer group died (or the group stopped answering)."""


class TorchrunTrainer(GroupHandle):
    """The local backend's handle on a torchrun-launched group; see the module docstring."""

    conn: Connection | None = None  # to rank 0's command listener
    proc: subprocess.Popen | None = None  # torchrun, leader of its own session
    _log: BinaryIO | None = None

    def _start(self, resume: bool, restarted: bool) -> None:
        d = self.run_dir / "trainer_group"
        d.mkdir(parents=True, exist_ok=True)
        config = d / "config.json"
        config.write_text(json.dumps(self.cfg.model_dump(mode="json")))
        address = d / "address.json"
        address.unlink(missing_ok=True)
        key = secrets.token_bytes(16)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(self.cfg.trainer.world_size), "-m", "flywheel.orchestrator.trainer_group",
               "--config", str(config), "--run-dir", str(self.run_dir), "--base-model", str(self.base_model_dir),
               "--address-file", str(address)] + (["--resume"] if resume else []) + \
              (["--restarted"] if restarted else [])
        self.log_path = d / "torchrun.log"
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, **{AUTHKEY_ENV: key.hex()})
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.cfg.orchestrator.start_timeout_s
        while not address.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the trainer group did not start (torchrun exit {self.proc.returncode}); its "
                                   f"log:\n{self._tail()}")
            time.sleep(0.2)
        port = json.loads(address.read_text())["port"]
        self.conn = Client(("127.0.0.1", port), authkey=key)

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _send(self, method: str, args: tuple) -> tuple[str, Any]:
        if self.conn is None:
            raise GroupFailed("the trainer group is stopped")
        try:
            self.conn.send((method, args))
            return self.conn.recv()
        except (EOFError, OSError) as err:
            raise GroupFailed(f"{type(err).__name__}: {err}; torchrun log:\n{self._tail()}") from err

    def _stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # the agent and its ranks share a session: end them all
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None



if __name__ == "__main__":
    serve_rank()
