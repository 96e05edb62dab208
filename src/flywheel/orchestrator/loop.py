"""The RL loop, trainer side: admit groups, step whenever a batch is ready, publish, log, checkpoint.

    summary = run_rl(cfg, run_dir, base_model_dir, tokenizer_dir, train_tasks, resume=False)

`mode = "async"`: the inference nodes never stop producing; the buffer admits groups whose staleness is
at most `max_staleness` and drops the rest; the trainer steps as soon as it holds `batch_size`
trajectories. With `max_ahead_batches > 0` production is paced instead: engines start a group only with a
permit, and permits keep them at most that many batches ahead of the trainer (orchestrator/pacing.py).
`mode = "sync"`: request exactly a batch at the current version, train, publish, repeat — the on-policy
baseline. Backends differ only in the rollout source (local processes or Ray actors).

Nothing admitted is lost: every admitted group is appended to `trajectories/admitted.jsonl` before it can
be trained on, and a checkpoint records which of them were already consumed; `--resume` puts the rest
back into the buffer. SIGINT/SIGTERM stop the loop after the current step and write a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from flywheel.config import FlywheelConfig
from flywheel.metrics.dashboard.transcript import TokenDecoder
from flywheel.metrics.log import MetricsLog
from flywheel.orchestrator.local import LocalRollouts
from flywheel.orchestrator.monitor import FlagMonitor, step_flag_rates
from flywheel.orchestrator.node import NodeSpec
from flywheel.orchestrator.pacing import ahead_limit, paced, to_grant
from flywheel.orchestrator.ray import RayRollouts
from flywheel.orchestrator.source import RolloutSource
from flywheel.orchestrator.trainers import build_trainer
from flywheel.policy.tokenizer import load_tokenizer, save_tokenizer
from flywheel.rollout.evaluate import solved
from flywheel.rollout.summary_metrics import summary_metrics
from flywheel.trainer.buffer import Buffer
from flywheel.types import Task, Trajectory


class AdmittedLog:
    """Append-only JSONL of admitted groups, indexed from 0; survives a killed trainer."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.count = sum(1 for _ in self.read())
        self._file = path.open("a")

    def append(self, group: list[Trajectory]) -> int:
        index = self.count
        self._file.write(json.dumps({"index": index, "group": [t.to_dict() for t in group]}) + "\n")
        self._file.flush()
        self.count += 1
        return index

    def read(self):
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a torn last line from a killed writer
                continue
            yield row["index"], [Trajectory.from_dict(t) for t in row["group"]]

    def close(self) -> None:
        self._file.close()


def batch_metrics(batch: list[Trajectory]) -> dict[str, float]:
    rewards = [t.graded.value for t in batch]
    flags = [f for t in batch for f in t.graded.flags]
    return {
        "reward/mean": statistics.fmean(rewards),
        "rollout/pass_rate": statistics.fmean(float(solved(t)) for t in batch),
        "rollout/turns": statistics.fmean(t.num_turns for t in batch),
        "rollout/tool_errors": statistics.fmean(t.num_tool_errors for t in batch),
        "rollout/sampled_tokens": statistics.fmean(t.meta.get("num_sampled_tokens", 0) for t in batch),
        "flags/total": float(len(flags)),
        **{f"flags/{f}": float(flags.count(f)) for f in sorted(set(flags))},
    }


def received_metrics(groups: list[list[Trajectory]]) -> dict[str, float]:
    """Reward and pass rate of every group that arrived since the last step, dropped ones included: the
    learning curve (the trained batch is biased towards mixed groups when uniform groups are dropped).
    Sessions that failed outside the policy have no reward and are left out (the buffer counts them)."""
    starts = sorted(1000 * t.timings["sandbox_start_s"] for g in groups for t in g if "sandbox_start_s" in t.timings)
    sandbox = {"sandbox/startup_ms_p50": statistics.median(starts),
               "sandbox/startup_ms_max": starts[-1]} if starts else {}
    trajs = [t for g in groups for t in g if t.reward is not None]
    if not trajs:
        return sandbox
    # self-summarization (rollout/summary_metrics.py): summaries per session, finish after one, tokens processed
    summaries = {f"summary/{k}": float(v) for k, v in summary_metrics(trajs).items()
                 if isinstance(v, (int, float)) and k != "num_sessions"}
    return {**sandbox, **summaries, "rollout/reward_all": statistics.fmean(t.graded.value for t in trajs),
            "rollout/pass_rate_all": statistics.fmean(float(solved(t)) for t in trajs),
            "rollout/num_all": float(len(trajs)),
            "rollout/submitted": statistics.fmean(float(bool(t.meta.get("submitted"))) for t in trajs),
            "rollout/test_runs": statistics.fmean(map(float, map(hidden_tests_ran, trajs)))}


def hidden_tests_ran(traj: Trajectory) -> bool:
    """Whether grading ran the session's hidden tests in a sandbox (not from the grade cache, not skipped;
    a session that failed outside the policy was not graded)."""
    if traj.reward is None:
        return False
    components = traj.reward.components
    return not (components.get("tests_cached") or components.get("tests_not_run"))


class NoSignalWatch:
    """Says once, on stderr, that the run cannot step: every group lately earned one reward (the policy solves none
    of the tasks, or all), so drop_uniform_groups leaves nothing to train on and RL would wait for ever. With
    `orchestrator.halt_without_signal = n`, `observe` returns True once n groups in a row were such: the loop then
    stops as it does for a flag rate (a checkpoint, `rl.halted`, `--resume` goes on)."""

    def __init__(self, cfg: FlywheelConfig):
        self.limit = 4 * max(1, math.ceil(cfg.trainer.batch_size / cfg.rollout.group_size))
        self.halt_after = cfg.orchestrator.halt_without_signal
        self.streak, self.warned = 0, False

    def observe(self, verdict: str, group: list[Trajectory]) -> bool:
        """Count the group; True when the run should stop for want of signal."""
        self.streak = self.streak + 1 if verdict == "uniform" else 0 if verdict == "admitted" else self.streak
        halt = 0 < self.halt_after <= self.streak
        if self.streak >= self.limit and not self.warned and not halt:
            self.warned = True
            reward = next((t.reward.value for t in group if t.reward is not None), "?")
            logging.getLogger(__name__).warning(
                "the last %d groups each earned one reward for every session (%s): no learning signal, so no "
                "trainer step can run. Mid-train the policy more (midtrain.*), train on easier tasks "
                "(synth.difficulties), or set orchestrator.drop_uniform_groups = false", self.streak, reward)
        return halt


def run_rl(cfg: FlywheelConfig, run_dir: Path, base_model_dir: Path, tokenizer_dir: Path, tasks: list[Task], *,
           resume: bool = False, on_step: Callable[[dict], None] | None = None,
           stop_event: threading.Event | None = None) -> dict:
    """Run RL until `cfg.trainer.num_steps` trainer steps; returns the loop's summary figures."""
    run_dir = Path(run_dir)
    # The nodes take one core each (NodeSpec.num_threads); the trainer gets the rest, at least one.
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - cfg.orchestrator.num_engines - 1))
    stop_event = stop_event or threading.Event()
    sync = cfg.orchestrator.mode == "sync"
    # the trainer side (Trainer + Publisher + weight store): in this process, or a restartable Ray actor;
    # it loads the checkpoint (resume), trims the store to the trainer's version and publishes version 0
    trainer = build_trainer(cfg, run_dir, base_model_dir, resume=resume)
    buffer = Buffer(max_staleness=0 if sync else cfg.orchestrator.max_staleness,
                    drop_uniform_groups=cfg.orchestrator.drop_uniform_groups)
    admitted = AdmittedLog(run_dir / "trajectories" / "admitted.jsonl")
    state = trainer.extra_state
    if state:
        waiting = set(state.get("waiting", [])) | set(range(state.get("num_admitted", 0), admitted.count))
        restored = [(i, g) for i, g in admitted.read() if i in waiting]
        buffer.restore(restored)
        buffer.counters.update(state.get("counters", {}))
        buffer.counters["restored"] = len(restored)
    specs = [NodeSpec(config=cfg.model_dump(mode="json"), model_dir=str(base_model_dir), tokenizer_dir=str(tokenizer_dir),
                      tasks=tasks, store_url=trainer.store_url, cache_dir=str(run_dir / "cache" / f"node{n}"), node_id=n,
                      seed=cfg.seed + 1000 * trainer.version,
                      max_groups_in_flight=max(1, cfg.rollout.concurrency // cfg.rollout.group_size))
             for n in range(cfg.orchestrator.num_engines)]
    source = build_rollouts(cfg, specs)
    log = MetricsLog.from_config(run_dir, cfg.metrics, run_name=cfg.name, config=cfg.model_dump(mode="json"))
    decoder = TokenDecoder.from_dir(tokenizer_dir) if cfg.metrics.transcripts_every else None
    outstanding = 0
    # paced async mode (orchestrator/pacing.py): group starts are granted so that production runs at most
    # `max_ahead_batches` batches ahead of the trainer
    pace = paced(cfg)
    num_granted = num_groups_received = 0
    node_stats: dict = {}
    num_rollouts = num_tokens = num_tested = 0
    received: list[list[Trajectory]] = []  # every group since the last step
    busy_s = 0.0
    monitor = FlagMonitor(cfg.env.flag_rate_window, cfg.env.halt_on_flag_rate)
    halted: dict | None = None
    no_signal = NoSignalWatch(cfg)
    previous_handlers = _install_stop_handlers(stop_event)
    try:
        source.start(timeout_s=cfg.orchestrator.start_timeout_s)  # inside: an engine that fails to start is stopped too
        t_start = time.monotonic()
        while trainer.version < cfg.trainer.num_steps and not stop_event.is_set():
            if pace:
                num_granted += _grant(cfg, source, specs[0], num_granted, num_groups_received, buffer.num_groups)
            if sync and outstanding == 0 and len(buffer) < cfg.trainer.batch_size:
                # only the groups the batch lacks: after a uniform group was dropped, a whole batch more would
                # leave groups over, which go stale at the step and are dropped (sync generated more than async)
                missing = math.ceil((cfg.trainer.batch_size - len(buffer)) / cfg.rollout.group_size)
                source.request(missing, min_version=trainer.version)
                outstanding = missing
            try:
                msg = source.get(timeout_s=0.5)
            except RuntimeError:
                if stop_event.is_set():  # the signal reached the engines too (Ctrl-C, a kill of the process
                    break                # group): stop as asked, with a checkpoint, not as a crash
                raise
            if msg is not None and msg[0] == "group":
                _, node_id, group, stats = msg
                node_stats[node_id] = stats
                outstanding = max(0, outstanding - 1)
                num_groups_received += 1
                num_rollouts += len(group)
                num_tested += sum(map(hidden_tests_ran, group))
                received.append(group)
                monitor.observe(group)
                trip = monitor.tripped() if halted is None else None
                if trip is not None:  # stop like a Ctrl-C: finish nothing more, checkpoint, exit
                    halted = {"flag": trip[0], "rate": trip[1], "window": monitor.window,
                              "threshold": monitor.halt_rate, "step": trainer.version}
                    stop_event.set()
                num_tokens += sum(t.meta.get("num_sampled_tokens", 0) for t in group)
                verdict = buffer.admit(group, trainer.version, key=admitted.count)
                if verdict == "admitted":
                    admitted.append(group)
                if no_signal.observe(verdict, group) and halted is None:
                    halted = {"reason": "no_signal", "groups": no_signal.streak, "step": trainer.version}
                    stop_event.set()
            batch = buffer.take(cfg.trainer.batch_size, trainer.version)
            if batch is None:
                continue
            # the batch's groups are retired: engines may start as many before the step, not after it
            if pace:
                num_granted += _grant(cfg, source, specs[0], num_granted, num_groups_received, buffer.num_groups)
            staleness = [trainer.version - t.min_version for t in batch if t.min_version >= 0]
            t0 = time.monotonic()
            metrics = trainer.step(batch)
            busy_s += time.monotonic() - t0
            trainer.publish()
            elapsed = time.monotonic() - t_start
            record = {"step": trainer.version, **metrics, **batch_metrics(batch), **received_metrics(received),
                      "staleness/mean": statistics.fmean(staleness) if staleness else 0.0,
                      "staleness/max": max(staleness, default=0),
                      "trainer/busy": busy_s / elapsed, "time/elapsed_s": elapsed,
                      "throughput/rollouts_per_s": num_rollouts / elapsed,
                      "throughput/tokens_per_s_k": num_tokens / elapsed / 1000,
                      **{f"buffer/{k}": v for k, v in buffer.counters.items()},
                      **step_flag_rates(received),
                      **{f"flags/window_rate/{f}": r for f, r in monitor.rates().items()},
                      **_weights_metrics(trainer), **node_metrics(node_stats),
                      **source.pool_stats()}  # Ray: pool-wide counters
            received.clear()
            log.write(record)
            if cfg.metrics.transcripts_every and trainer.version % cfg.metrics.transcripts_every == 0:
                log.transcripts(trainer.version, batch, decoder)
            if on_step:
                on_step(record)
            if cfg.trainer.checkpoint_every and trainer.version % cfg.trainer.checkpoint_every == 0:
                trainer.save_checkpoint(_loop_state(buffer, admitted))
    finally:
        _restore_stop_handlers(previous_handlers)
        final_stats = source.stop()
        trainer.flush()
        trainer.save_checkpoint(_loop_state(buffer, admitted))
        if not stop_event.is_set() and trainer.version >= cfg.trainer.num_steps:
            trainer.save_model(run_dir / "final_model")
            # eval, serve and any HF tool load the directory alone: it carries its tokenizer and chat template
            save_tokenizer(load_tokenizer(tokenizer_dir), run_dir / "final_model")
        trainer.close()
        admitted.close()
        log.close()
    elapsed = time.monotonic() - t_start
    return {"steps": trainer.version, "wall_s": elapsed, "trainer_busy": busy_s / elapsed if elapsed else 0.0,
            "rollouts": num_rollouts, "rollouts_tested": num_tested, "groups_received": num_groups_received,
            "groups_granted": num_granted if pace else None, "interrupted": stop_event.is_set(), "halted": halted,
            "staleness_hist": dict(buffer.staleness_hist), **{f"buffer/{k}": v for k, v in buffer.counters.items()},
            **node_metrics({0: final_stats} if final_stats else node_stats)}


def _grant(cfg: FlywheelConfig, source, spec, granted: int, received: int, waiting: int) -> int:
    """Paced async mode: grant the engines the group starts that bring the unretired groups up to the limit
    (orchestrator/pacing.py); returns how many were granted."""
    limit = ahead_limit(cfg, source.num_engines, spec.max_groups_in_flight)
    n = to_grant(limit, granted, received, waiting)
    if n:
        source.allow(n)
    return n


def build_rollouts(cfg: FlywheelConfig, specs: list) -> RolloutSource:
    """The rollout source of `cfg.orchestrator.backend`: child processes (local) or Ray actors."""
    if cfg.orchestrator.backend == "ray":
        return RayRollouts(specs, cfg)

    return LocalRollouts(specs, mode=cfg.orchestrator.mode)


def _loop_state(buffer: Buffer, admitted: AdmittedLog) -> dict:
    return {"num_admitted": admitted.count, "waiting": buffer.waiting_keys(),
            "counters": dict(buffer.counters)}


def _weights_metrics(trainer) -> dict[str, float]:
    """Figures of the newest version the publisher has finished (encoding runs in the background)."""
    finished = trainer.publisher_metrics()
    if not finished:
        return {}
    m = finished[-1]
    return {"weights/bytes_mb": m["bytes_published"] / 1e6, "weights/ratio": m["ratio"],
            "weights/encode_ms": m["encode_ms"], "weights/changed_fraction": m.get("changed_fraction") or 0.0}


def node_metrics(node_stats: dict) -> dict[str, float]:
    """The nodes' newest figures: sandbox counts summed over nodes, everything else averaged."""
    out: dict[str, list[float]] = {}
    for stats in node_stats.values():
        for k, v in stats.items():
            if isinstance(v, (int, float)):
                out.setdefault(k, []).append(float(v))
    return {k: sum(v) if k.startswith("sandbox/") else statistics.fmean(v) for k, v in out.items()}


def _install_stop_handlers(stop_event: threading.Event):
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if stop_event.is_set():
            raise KeyboardInterrupt
        stop_event.set()  # finish the current step, checkpoint, exit

    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore_stop_handlers(previous) -> None:
    for s, h in (previous or {}).items():
        signal.signal(s, h)
