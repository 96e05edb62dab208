"""Config sections of real-time RL (`[online.serve]`, `[online.learner]`, `[online.gate]`, `[online.deploy]`,
`[online.pool]`; docs/online.md): serving, the online learner, the deploy gate and rollback, background rollouts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flywheel.config.base import Section

SIGNALS = ("accept", "reject", "edit_kept", "edit_reverted", "thumbs_up", "thumbs_down", "follow_up")


class ServeConfig(Section):
    """`flywheel serve`: the OpenAI-compatible HTTP API (online/server.py)."""

    host: str = Field("127.0.0.1", min_length=1, description="address to bind (loopback by default)")
    port: int = Field(8470, ge=0, le=65_535, description="TCP port; 0 = a free port (printed at start)")
    db_url: str = Field("", description="event log: a SQLAlchemy URL (sqlite:///path.db, postgresql+psycopg://…) or "
                        "a file path; '' = <run_dir>/online.db (SQLite in WAL mode)")
    model_name: str = Field("flywheel", min_length=1, description="the model id `/v1/models` lists and requests name")
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30, description="largest request body any key may send "
                                "(bytes); a key's own limit may be lower")
    requests_per_min: int = Field(600, ge=1, le=1_000_000, description="default per-key rate limit (requests per "
                                  "minute, token bucket with a burst of this size) for keys created without one")
    max_tokens: int = Field(256, ge=1, le=1_048_576, description="largest max_tokens a request may ask for (tokens)")
    default_max_tokens: int = Field(128, ge=1, le=1_048_576, description="max_tokens when a request gives none")
    deploy_poll_s: float = Field(0.5, gt=0, le=60, description="seconds between reads of the deployed version "
                                 "(a deploy or rollback reaches this server within it)")
    key_recheck_s: float = Field(5.0, ge=0, le=3600, description="seconds a server trusts a key it has read before "
                                 "reading it again (a `flywheel keys revoke` reaches every server within it); 0 = "
                                 "read the key on every request")
    rate_limit: Literal["local", "shared"] = Field("local", description="where the per-key token buckets live: "
                                                   "'local' = in each server process (N hosts allow N times a key's "
                                                   "rate), 'shared' = in the event log's database, one bucket per key "
                                                   "for every host (one UPDATE per request)")


class LearnerConfig(Section):
    """The online learner (online/learner.py): signals to rewards, single-sample policy gradient, candidates."""

    enabled: bool = Field(True, description="run the learner inside `flywheel serve` (false: serve only)")
    rewards: dict[str, float] = Field(
        {"accept": 0.75, "reject": -0.25, "edit_kept": 1.0, "edit_reverted": -0.5, "thumbs_up": 1.0,
         "thumbs_down": -1.0, "follow_up": -0.5},
        description="reward per feedback signal (the Tab mapping: accept +0.75, reject -0.25); signals not listed "
                    "are recorded but not trained on")
    baseline_decay: float = Field(0.95, ge=0, lt=1, description="running-baseline decay per event: b <- d*b + "
                                  "(1-d)*r; the advantage is r - b")
    batch_size: int = Field(8, ge=1, le=4096, description="feedback events per trainer step")
    candidate_every_events: int = Field(32, ge=1, description="propose a candidate after this many trained events")
    candidate_every_s: float = Field(600.0, gt=0, description="or after this many seconds with at least one step")
    poll_s: float = Field(0.2, gt=0, le=60, description="seconds between reads of new feedback")
    lr: float = Field(1e-3, gt=0, le=1, description="learning rate of the online trainer (overrides trainer.lr)")
    max_lag: int = Field(8, ge=0, le=100_000, description="skip feedback on completions more than this many "
                         "versions older than the learner's base (the importance weights of older ones are noise)")

    @model_validator(mode="after")
    def _check_signals(self) -> LearnerConfig:
        unknown = sorted(set(self.rewards) - set(SIGNALS))
        if unknown:
            raise ValueError(f"online.learner.rewards: unknown signals {unknown}; known: {list(SIGNALS)}")
        return self


class GateConfig(Section):
    """The deploy gate (online/gate.py): held-out paired eval of candidate vs serving, and hack monitors."""

    enabled: bool = Field(True, description="false ships every candidate (tests of the rollback path only)")
    num_prompts: int = Field(128, ge=4, le=100_000, description="held-out prompts scored per candidate (the same "
                             "prompts and seeds every time, so the scores of a version are kept, not recomputed)")
    compare_last: int = Field(4, ge=0, le=1000, description="also judge a candidate against the best-scoring of "
                              "the last N versions deployed before the serving one, so that small regressions, "
                              "none significant alone, cannot add up; 0 = against the serving version only")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="significance of the one-sided paired sign test: reject "
                         "when P(a candidate no worse than serving loses this often) < alpha")
    max_mean_drop: float = Field(0.05, ge=0, le=1, description="reject when the mean held-out score drops by more "
                                 "than this, significant or not")
    max_broken_tool_call_increase: float = Field(0.05, ge=0, le=1, description="reject when the share of replies "
                                                 "with a broken tool call rises by more than this")
    max_question_increase: float = Field(0.05, ge=0, le=1, description="reject when the share of replies that ask "
                                         "a question instead of calling a tool rises by more than this")
    max_flag_increase: float = Field(0.02, ge=0, le=1, description="reject when any integrity flag's rate rises by "
                                     "more than this")
    coding_num_tasks: int = Field(16, ge=1, le=100_000, description="when the candidate trained on the pool's "
                                  "rollouts (online.pool.train): held-out synthetic coding tasks it also runs through "
                                  "the agent loop and sandboxed grading, paired per task with the serving version "
                                  "(same seeds; eval.temperature); the same rules (alpha, max_mean_drop, "
                                  "max_flag_increase) apply to their pass rates")
    coding_num_samples: int = Field(2, ge=1, le=1024, description="sessions per held-out coding task (a task's score "
                                    "is its share of solved sessions)")


class DeployConfig(Section):
    """Deploy and automatic rollback (online/deploy.py)."""

    rollback_window: int = Field(32, ge=1, le=1_000_000, description="feedback events on a new version's completions "
                                 "the live monitor judges it on")
    rollback_drop: float = Field(0.2, gt=0, le=10, description="roll back when the mean reward over the window falls "
                                 "this far below the previous version's")
    min_window_fraction: float = Field(1.0, gt=0, le=1, description="share of the window needed before judging")


class PoolConfig(Section):
    """One engine pool for users and training (online/pool.py): simulated RL rollouts on the serving engine's
    left-over capacity, users first."""

    rollouts: bool = Field(False, description="run simulated RL rollouts (synthetic tasks, the RL loop's agent "
                           "loop and grading) on the serving engine at background priority")
    max_background_rows: int = Field(8, ge=1, le=65_536, description="most batch rows background requests may hold "
                                     "at once (<= inference.max_batch_size); the other rows are kept free for users")
    max_background_prefill_tokens: int = Field(512, ge=1, le=1_048_576, description="while users are in the batch, "
                                               "most background prompt tokens prefilled in one step (one prompt at "
                                               "least): a prefill stalls every row's decode step")
    groups_in_flight: int = Field(2, ge=1, le=1024, description="rollout groups running at once; each has "
                                  "rollout.group_size sessions (rollout.concurrency caps the sessions)")
    num_tasks: int = Field(64, ge=1, le=1_000_000, description="synthetic training tasks generated at start "
                           "(synth.difficulties and synth.test_runner apply), sampled uniformly")
    log_trajectories: bool = Field(True, description="append each graded group to <run_dir>/pool/trajectories.jsonl "
                                   "(the RL loop's admitted.jsonl format: {index, group})")
    train: bool = Field(False, description="the online learner trains on the pool's graded groups (needs rollouts "
                        "and online.learner.enabled); candidates that did are also gated on held-out coding tasks")
    advantage: Literal["grpo", "drgrpo"] = Field("grpo", description="group-relative advantage of a pool group "
                                                 "(trainer/advantages.py)")
    batch_size: int = Field(16, ge=1, le=65_536, description="trajectories per group step (whole groups, oldest "
                            "first, until at least this many)")
    max_staleness: int = Field(1, ge=0, le=1000, description="drop groups whose oldest sampled token is more than "
                               "this many deployed versions behind the learner's base (counted as dropped_stale)")
    drop_uniform_groups: bool = Field(True, description="drop groups whose sessions all got one reward (every "
                                      "advantage 0: no signal), counted as dropped_uniform")
    group_step_share: float = Field(0.5, ge=0, le=1, description="share of the learner's steps that go to pool "
                                    "groups while both feedback and groups have a batch ready (0.5 alternates; "
                                    "either source trains alone when the other has none)")
    candidate_every_steps: int = Field(8, ge=1, le=1_000_000, description="propose a candidate after this many group "
                                       "steps (or online.learner.candidate_every_events feedback events, whichever "
                                       "comes first)")
    max_waiting_groups: int = Field(256, ge=1, le=1_000_000, description="groups waiting for the learner at most; the "
                                    "oldest beyond it are dropped (counted as dropped_overflow)")


class OnlineConfig(Section):
    """Real-time RL: serve the policy, learn from users' signals, deploy behind a gate, roll back
    (docs/online.md)."""

    serve: ServeConfig = Field(default_factory=ServeConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    deploy: DeployConfig = Field(default_factory=DeployConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)

    @model_validator(mode="after")
    def _check_pool_train(self) -> OnlineConfig:
        if self.pool.train and not (self.pool.rollouts and self.learner.enabled):
            raise ValueError("online.pool.train = true trains the online learner on the pool's rollouts: it needs "
                             "online.pool.rollouts = true and online.learner.enabled = true (or set "
                             "online.pool.train = false)")
        return self
