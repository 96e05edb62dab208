"""The online learner: users' signals become rewards, one sample at a time, and candidates go to the gate.

    learner = OnlineLearner(model, cfg, elog, store_url, gate, trainer_cfg)
    learner.poll()            # read new feedback, train, maybe propose a candidate (blocking: run it in a thread)
    learner.run(stop_event)   # poll every online.learner.poll_s

Signals map to rewards through `online.learner.rewards` (the Tab mapping is the default: accept +0.75,
reject -0.25). Online there is one sample per prompt, so there is no group to compare with: the advantage is
r - b, with b a bias-corrected running mean of past rewards (`baseline_decay`), and the trainer runs with
`advantage = "given"` (trainer/advantages.py). Each feedback event becomes a one-segment Trajectory holding the
exact served tokens: `prompt_ids + token_ids`, loss mask on the sampled ones, the sampler's log-probs and
versions. The completion was sampled by the serving version, while the learner has moved on since, so the
trainer's off-policy correction (`trainer.correction`, TIS by default: the learner's recomputed log-probs
against the sampler's, truncated) is the importance correction for that version lag; feedback on completions
more than `max_lag` versions behind the learner's base is skipped.

Every `candidate_every_events` trained events (or `candidate_every_s` seconds with at least one step) the learner
publishes its weights to the store as a new version, appends a `candidate` event (with the feedback range and the
keys it learned from), and asks the gate. Pass: a `deploy` event (every server installs it). Reject: a
`gate_reject` event with the gate's reason, and the learner returns to the deployed weights (`learner_reset`), so a
poisoned burst does not stay in the policy. The live monitor (online/deploy.py) watches feedback per version and
appends a `rollback` when a deployed version's reward drops past the threshold; the learner then resets too.

With the pool's groups (`groups`, a GroupInbox the background rollouts fill; online.pool.train = true) the same
trainer and optimizer also take group steps: each graded group passes the trainer's buffer (`trainer/buffer.py`:
groups whose oldest sampled token is more than `online.pool.max_staleness` deployed versions behind the learner's
base are dropped and counted, uniform groups too), its advantages are group-relative (online/groups.py), the loss
and the TIS correction of the version lag are the trainer's. `groups.next_source` schedules feedback and group
steps; a group step scores log-probs at the rollouts' sampling temperature. A candidate comes after
`candidate_every_events` feedback events or `online.pool.candidate_every_steps` group steps, and one that took
group steps is also gated on held-out coding tasks (`gate.evaluate(..., coding=True)`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from flywheel.config import OnlineConfig, TrainerConfig
from flywheel.online.deploy import LiveMonitor, deploy_stack, deployed_version, rollback, rollback_target
from flywheel.online.events import CompletionRecord, EventLog, FeedbackRecord
from flywheel.online.gate import Gate
from flywheel.online.groups import GroupInbox, group_samples, next_source
from flywheel.trainer.buffer import Buffer
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, Segment, Trajectory
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher, Subscriber

log = logging.getLogger(__name__)


def signal_reward(signal: str, mapping: dict[str, float]) -> float | None:
    """The reward of a feedback signal, or None when the mapping does not train on it."""
    return mapping.get(signal)


class RunningBaseline:
    """Bias-corrected exponential mean of rewards: b_n = (1-d) sum_k d^(n-k) r_k / (1 - d^n)."""

    def __init__(self, decay: float):
        if not 0 <= decay < 1:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay, self.raw, self.n = decay, 0.0, 0

    @property
    def value(self) -> float:
        return self.raw / (1 - self.decay ** self.n) if self.n else 0.0

    def advantage(self, reward: float) -> float:
        """r - b with b from the rewards before this one, then b takes r in."""
        adv = reward - self.value
        self.raw = self.decay * self.raw + (1 - self.decay) * reward
        self.n += 1
        return adv


def trajectory_from(fb: FeedbackRecord, cpl: CompletionRecord, advantage: float, reward: float) -> Trajectory:
    """One training sample, token-exact: the served prompt and reply, loss on the reply's tokens."""
    n_prompt, n_reply = len(cpl.prompt_ids), len(cpl.token_ids)
    seg = Segment(token_ids=list(cpl.prompt_ids) + list(cpl.token_ids), loss_mask=[0] * n_prompt + [1] * n_reply,
                  logprobs=[0.0] * n_prompt + [float(x) for x in cpl.logprobs],
                  versions=[-1] * n_prompt + [int(v) for v in cpl.versions])
    return Trajectory(task_id=cpl.id, group_id=fb.id, segments=[seg],
                      reward=Reward(advantage, components={"reward": reward, "advantage": advantage}),
                      meta={"signal": fb.signal, "key_id": fb.key_id, "feedback_seq": fb.seq})


@dataclass
class LearnerStats:
    num_events: int = 0
    num_trained: int = 0
    num_skipped_lag: int = 0
    num_steps: int = 0  # all steps, feedback and group
    num_group_steps: int = 0
    num_group_trajectories: int = 0  # trained on in group steps
    candidates: list[int] = field(default_factory=list)
    deploys: list[int] = field(default_factory=list)
    rejects: list[int] = field(default_factory=list)
    rollbacks: list[int] = field(default_factory=list)
    last_metrics: dict[str, float] = field(default_factory=dict)


class OnlineLearner:
    """Owns a training copy of the policy; see the module docstring."""

    def __init__(self, model: Any, cfg: OnlineConfig, elog: EventLog, store_url: str, gate: Gate,
                 trainer_cfg: TrainerConfig, *, anchor_every: int = 10, groups: GroupInbox | None = None,
                 rollout_temperature: float = 1.0):
        self.cfg, self.lcfg, self.pcfg, self.elog, self.gate = cfg, cfg.learner, cfg.pool, elog, gate
        tcfg = trainer_cfg.model_copy(update={"advantage": "given", "lr": cfg.learner.lr, "kl_coef": 0.0,
                                              "checkpoint_every": 0, "warmup_steps": 0})
        self.trainer = Trainer(model, tcfg)
        self.model = model
        self.store = WeightStore(store_url)
        self.publisher = Publisher(self.store, anchor_every=anchor_every)
        self.weights = Subscriber(self.store)  # the deployed versions' weights, to start from and to reset to
        self.baseline = RunningBaseline(cfg.learner.baseline_decay)
        self.monitor = LiveMonitor(cfg.deploy.rollback_window, cfg.deploy.rollback_drop,
                                   cfg.deploy.min_window_fraction)
        self.stats = LearnerStats()
        self.cursor = 0
        self.pending: list[Trajectory] = []
        self.window: list[Trajectory] = []  # feedback samples trained since the last candidate (or reset)
        self.groups = groups
        self.buffer = Buffer(cfg.pool.max_staleness, cfg.pool.drop_uniform_groups) if groups is not None else None
        self.rollout_temperature = rollout_temperature or 1.0  # greedy rollouts: log-probs of the plain softmax
        self.window_groups: list[Trajectory] = []  # pool samples trained since the last candidate (or reset)
        self.window_group_steps = 0
        self.contested: Counter[str] = Counter()  # steps per source taken while both had a batch ready
        self.window_started_s = time.time()
        self.base_version = 0
        events = elog.events()
        for ev in events:  # resume: feedback already used for a candidate is not trained on twice
            if ev.kind == "candidate":
                self.cursor = max(self.cursor, int(ev.data.get("feedback_seq_last", 0)))
        self.reset_to_deployed("start")

    # ---- weights ----------------------------------------------------------------------------------

    def reset_to_deployed(self, why: str) -> int:
        """Load the deployed version's weights; drop optimizer state and the window the gate refused (events
        read but not yet trained on stay: they are samples like any other, their version lag corrected)."""
        v = deployed_version(self.elog.events(("deploy", "rollback")))
        if v is None:
            raise ValueError("no version is deployed yet; `flywheel serve` deploys version 0 at its first start")
        if self.weights.version != v and self.weights.poll(v) is None and self.weights.version != v:
            raise ValueError(f"cannot load deployed version {v} from the store: {self.weights.last_error}")
        state = self.weights.tensors
        own = self.model.state_dict()
        with_grad = {k: t.to(own[k].dtype).clone() for k, t in state.items() if k in own}
        self.model.load_state_dict(with_grad, strict=False)
        self.trainer.optimizer.state.clear()
        self.base_version = v
        self.window, self.window_groups, self.window_group_steps = [], [], 0
        self.window_started_s = time.time()
        if why != "start":
            self.elog.append_event("learner_reset", v, why)
        return v

    # ---- the loop ---------------------------------------------------------------------------------

    def _ingest(self, rows: list[tuple[FeedbackRecord, CompletionRecord]]) -> None:
        for fb, cpl in rows:
            self.cursor = max(self.cursor, fb.seq)
            r = signal_reward(fb.signal, self.lcfg.rewards)
            if r is None:
                continue
            self.stats.num_events += 1
            self.monitor.observe(cpl.version, r)
            if self.base_version - cpl.version > self.lcfg.max_lag:
                self.stats.num_skipped_lag += 1
                continue
            self.pending.append(trajectory_from(fb, cpl, self.baseline.advantage(r), r))

    def _check_live(self) -> bool:
        events = self.elog.events(("deploy", "rollback"))
        cur, prev = deployed_version(events), rollback_target(events)
        if cur is None:
            return False
        why = self.monitor.verdict(cur, prev)
        if why is None:
            return False
        rollback(self.elog, "automatic: " + why, {"source": "live_monitor"})
        self.stats.rollbacks.append(cur)
        self.monitor.rewards.pop(cur, None)
        self.reset_to_deployed(f"version {cur} rolled back")
        return True

    def poll(self) -> dict[str, Any]:
        """One round: read feedback, train full batches, check the live monitor, maybe propose a candidate."""
        rows = self.elog.feedback_after(self.cursor, limit=4 * self.lcfg.batch_size)
        self._ingest(rows)
        out: dict[str, Any] = {"num_read": len(rows)}
        if self._check_live():
            out["rolled_back"] = True
            return out
        if self.groups is not None:
            assert self.buffer is not None
            for group in self.groups.drain():
                self.buffer.admit(group, self.base_version)
        bs = self.lcfg.batch_size
        while not self._candidate_due():  # a candidate is judged on what it learned since the last: no more
            feedback_ready = len(self.pending) >= bs
            groups_ready = self.buffer is not None and len(self.buffer) >= self.pcfg.batch_size
            source = next_source(feedback_ready, groups_ready, self.contested, self.pcfg.group_step_share)
            if source is None:
                break
            if source == "groups" and not self._group_step():
                continue  # the waiting groups had aged past max_staleness: dropped, counted; decide again
            if feedback_ready and groups_ready:
                self.contested[source] += 1
            if source == "feedback":
                batch, self.pending = self.pending[:bs], self.pending[bs:]
                self.trainer.temperature = 1.0
                self.stats.last_metrics = self.trainer.step(batch)
                self.stats.num_steps += 1
                self.stats.num_trained += len(batch)
                self.window += batch
        if self._candidate_due():
            out["candidate"] = self.propose()
        return out

    def _candidate_due(self) -> bool:
        trained = bool(self.window or self.window_group_steps)
        return (len(self.window) >= self.lcfg.candidate_every_events or
                self.window_group_steps >= self.pcfg.candidate_every_steps or
                (trained and time.time() - self.window_started_s >= self.lcfg.candidate_every_s))

    def _group_step(self) -> bool:
        """One step on whole pool groups, oldest first; False when none was fresh enough to take."""
        assert self.buffer is not None
        batch = self.buffer.take(self.pcfg.batch_size, self.base_version)
        if batch is None:
            return False
        samples = group_samples(batch, self.pcfg.advantage)
        self.trainer.temperature = self.rollout_temperature  # the sampler's distribution: rollout.temperature
        self.stats.last_metrics = self.trainer.step(samples)
        self.stats.num_steps += 1
        self.stats.num_group_steps += 1
        self.stats.num_group_trajectories += len(samples)
        self.window_groups += samples
        self.window_group_steps += 1
        return True

    def status(self) -> dict[str, Any]:
        """Counters for `GET /v1/flywheel/status` → `learner`."""
        st = self.stats
        out: dict[str, Any] = {"base_version": self.base_version, "num_events": st.num_events,
                               "num_trained": st.num_trained, "num_skipped_lag": st.num_skipped_lag,
                               "num_steps": st.num_steps, "num_group_steps": st.num_group_steps,
                               "num_group_trajectories": st.num_group_trajectories,
                               "candidates": list(st.candidates), "deploys": list(st.deploys),
                               "rejects": list(st.rejects), "rollbacks": list(st.rollbacks)}
        if self.buffer is not None and self.groups is not None:
            out["groups"] = {"received": self.groups.num_put, "dropped_overflow": self.groups.num_overflow,
                             "waiting": self.buffer.num_groups, **dict(self.buffer.counters),
                             "staleness_trained": {str(k): v for k, v in sorted(self.buffer.staleness_hist.items())}}
        return out

    def propose(self) -> dict[str, Any]:
        """Publish the learner's weights as a new version and put them through the gate."""
        latest = self.store.latest_version()
        version = (latest if latest is not None else 0) + 1
        tensors = self.trainer.state_dict_for_publish()
        t0 = time.time()
        self.publisher.publish(version, tensors).result()
        data: dict[str, Any] = {"num_events": len(self.window), "base_version": self.base_version,
                                "publish_s": time.time() - t0}
        if self.window:
            seqs = [t.meta["feedback_seq"] for t in self.window]
            data.update({"feedback_seq_first": min(seqs), "feedback_seq_last": max(seqs),
                         "keys": sorted({t.meta["key_id"] for t in self.window}),
                         "events_per_key": dict(Counter(t.meta["key_id"] for t in self.window)),
                         "baseline": self.baseline.value, "last_feedback_s": max(self.elog_feedback_time(seqs))})
        what = f"{len(self.window)} feedback events"
        if self.window_group_steps:
            rewards = [float(t.graded.components["reward"]) for t in self.window_groups]
            data["pool"] = {"num_steps": self.window_group_steps, "num_trajectories": len(self.window_groups),
                            "num_groups": len({t.group_id for t in self.window_groups}),
                            "mean_reward": fmean(rewards),
                            "staleness_max": max(self.base_version - t.min_version for t in self.window_groups)}
            what += f" and {data['pool']['num_groups']} pool groups ({self.window_group_steps} group steps)"
        self.elog.append_event("candidate", version, f"{what} since version {self.base_version}", data)
        self.stats.candidates.append(version)
        serving = self.base_version
        if self.weights.version != serving:
            self.weights.poll(serving)
        stack = deploy_stack(self.elog.events(("deploy", "rollback")))
        refs = tuple(stack[-self.cfg.gate.compare_last - 1:-1]) if self.cfg.gate.compare_last else ()
        verdict = self.gate.evaluate(serving, self.weights.tensors, version, tensors, refs,
                                     coding=self.window_group_steps > 0)
        figures = verdict.figures
        if verdict.passed:
            self.elog.append_event("gate_pass", version, verdict.reason, figures)
            self.elog.append_event("deploy", version, "gate passed: " + verdict.reason, {"from_version": serving})
            self.stats.deploys.append(version)
            self.base_version = version
            self.window, self.window_groups, self.window_group_steps = [], [], 0
            self.window_started_s = time.time()
        else:
            self.elog.append_event("gate_reject", version, verdict.reason, figures)
            self.stats.rejects.append(version)
            self.reset_to_deployed(f"candidate {version} rejected by the gate")
        return {"version": version, "passed": verdict.passed, "reason": verdict.reason}

    def elog_feedback_time(self, seqs: list[int]) -> list[float]:
        rows = self.elog.feedback_after(min(seqs) - 1, limit=max(seqs) - min(seqs) + 1)
        return [fb.created_s for fb, _ in rows if fb.seq in set(seqs)] or [time.time()]

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set; a failed round is logged and retried, never fatal to the server."""
        while not stop.is_set():
            try:
                out = self.poll()
            except Exception:  # noqa: BLE001 - the learner must not take the serving process down
                log.exception("online learner round failed")
                out = {"num_read": 0}
            if not out.get("num_read"):
                stop.wait(self.lcfg.poll_s)

    def close(self) -> None:
        self.publisher.close()
        self.weights.close()
