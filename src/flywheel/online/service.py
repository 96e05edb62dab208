"""`flywheel serve` put together: model, engine, event log, weight store, deploy follower, learner, HTTP.

    flywheel serve configs/online.toml                      # or: flywheel serve --model runs/demo/final_model
    service = Service.build(cfg, model_dir=None); await service.start(); ...; await service.stop()

At the first start the store is empty: the policy's weights are published as version 0 and a `deploy` event for
it is written, so every later version (candidates, rollbacks) travels through the store and the log. A restart
(after `kill -9` too) finds both and serves the deployed version again. With no API key in the log, one named
`default` is created and printed once (and written to `--key-file`); more with `flywheel keys add`.

The learner runs in a thread of this process on its own copy of the policy, and the gate on a third copy in its
own engine, so serving never waits for training except for CPU time (online.learner.enabled = false serves only).
With online.pool.rollouts = true, simulated RL rollouts run on the serving engine itself at background priority
(online/pool.py): users first, the rollouts on what is left. With online.pool.train = true their graded groups go
to the learner's inbox and it trains on them too (online/groups.py); its gate then also runs held-out coding tasks
(online/coding_suite.py) in the gate's engine, with the sandboxes' cache under <run_dir>/gate.

With inference.type = "vllm" the serving engine is a vLLM server that flywheel launches on the policy's checkpoint
(`--model`, or the preset saved to <run_dir>/serve-model); deploys and rollbacks reach it through the weight store's
delta path inside vLLM's workers (inference/vllm.py `StoreSync.poll(target)`). The learner and the gate keep their
own local engines. The pool needs the local engine's priority admission and refuses vLLM.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from flywheel.config import FlywheelConfig
from flywheel.envs.remote_client import env_factory
from flywheel.envs.tools import tools_for
from flywheel.inference.local import LocalEngine, build_engine
from flywheel.inference.registry import build_node_engine
from flywheel.online.coding_suite import CodingSuite
from flywheel.online.deploy import DeploymentFollower
from flywheel.online.events import EventLog
from flywheel.online.gate import Gate
from flywheel.online.groups import GroupInbox
from flywheel.online.keys import new_key
from flywheel.online.learner import OnlineLearner
from flywheel.online.pool import BackgroundRollouts
from flywheel.online.server import ServingState, build_app
from flywheel.online.simulator import PreferenceSuite, SuggestionTask
from flywheel.policy.chat import ChatFormat
from flywheel.policy.model import build_model, load_model, save_model
from flywheel.policy.model_dir import check_tokenizer_dir, resolve_model_dir
from flywheel.policy.tokenizer import get_tokenizer, load_tokenizer, save_tokenizer
from flywheel.tasks.synth import Split, generate_tasks
from flywheel.types import Task, Trajectory
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher, Subscriber

log = logging.getLogger(__name__)


def db_url_of(cfg: FlywheelConfig) -> str:
    return cfg.online.serve.db_url or str(Path(cfg.run_dir) / "online.db")


def store_url_of(cfg: FlywheelConfig) -> str:
    return cfg.weights.store or str(Path(cfg.run_dir) / "weights")


def load_policy(cfg: FlywheelConfig, model_dir: str | None) -> tuple[Any, Any]:
    """(model, tokenizer): a saved checkpoint dir (with its tokenizer), or the config's preset."""
    if model_dir:  # checked first (Service.build): config.json, weights, a tokenizer with the chat markers
        return load_model(model_dir, cfg.model.dtype), load_tokenizer(model_dir)
    tok = get_tokenizer(cfg.tokenizer, Path.home() / ".cache" / "flywheel" / "tokenizers")
    model = build_model(cfg.model, len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model, tok


def ensure_initial(elog: EventLog, store_url: str, model: Any, anchor_every: int) -> None:
    """Version 0 in the store and deployed, unless a version is deployed already."""
    store = WeightStore(store_url)
    if store.latest_version() is None:
        with Publisher(store, anchor_every=anchor_every) as pub:
            pub.publish(0, {k: v.detach() for k, v in model.state_dict().items()}).result()
    if not elog.events(("deploy",)):
        elog.append_event("deploy", 0, "initial version (the policy `flywheel serve` started with)")


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on now, before the model loads (seconds) and before a key is made.

    An OSError(EADDRINUSE) that the command line reports as one line naming the option to change."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what aiohttp sets: TIME_WAIT is no clash
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise OSError(errno.EADDRINUSE, f"{host}:{port} is taken") from None
            raise


def ensure_key(elog: EventLog, cfg: FlywheelConfig, key_file: str | None) -> str | None:
    """Create the `default` key when the log has none; returns it (shown once) or None. Called once the API
    listens: a start that fails before that (a port clash) stores no key it could not show."""
    if elog.keys():
        return None
    key, rec = new_key("default", cfg.online.serve.requests_per_min, cfg.online.serve.max_body_bytes)
    elog.add_key(rec)
    if key_file:
        Path(key_file).write_text(key + "\n")
        Path(key_file).chmod(0o600)
    return key


def check_vllm(cfg: FlywheelConfig) -> None:
    """Refuse the settings that cannot serve through vLLM, naming the key to change."""
    if cfg.online.pool.rollouts:
        raise ValueError("online.pool.rollouts = true needs inference.type = \"local\": the background rollouts rely on "
                         "the local engine's priority admission (users' rows first, a cap on the rollouts' rows), "
                         "which the vLLM engine does not offer; set online.pool.rollouts = false to serve through vLLM")
    if cfg.model.dtype != cfg.inference.vllm.dtype:
        raise ValueError(f"model.dtype = '{cfg.model.dtype}' but inference.vllm.dtype = '{cfg.inference.vllm.dtype}': "
                         f"the weight store publishes the model's dtype and vLLM must serve the same; set both alike")


def serving_engine(cfg: FlywheelConfig, model: Any, tok: Any, model_dir: str | None,
                   store_url: str) -> tuple[Any, Any]:
    """(engine, subscriber) that serve users: the local engine on `model` and a store `Subscriber`, or (inference.type
    = "vllm") a launched vLLM server on the policy's checkpoint and its `StoreSync`. Both install what the deploy
    follower asks for through `subscriber.poll(version)`."""
    if cfg.inference.type == "vllm":
        ckpt = Path(model_dir) if model_dir else Path(cfg.run_dir) / "serve-model"
        if not model_dir:  # vLLM loads a checkpoint directory: the preset (version 0), saved with its tokenizer
            save_model(model, ckpt)
            save_tokenizer(tok, ckpt)
        # the context is the checkpoint's, as the local engine's (a saved model may differ from model.max_seq_len)
        ctx = cfg.model.model_copy(update={"max_seq_len": int(model.config.max_position_embeddings)})
        return build_node_engine(cfg.model_copy(update={"model": ctx}), ckpt, tok, store_url, Path(cfg.run_dir),
                                 name="serve-vllm")
    pool_cfg = cfg.online.pool
    engine = build_engine(cfg.inference, model, tok, cfg.numerics.batch_invariant,
                          pool_cfg.max_background_rows if pool_cfg.rollouts else None,
                          pool_cfg.max_background_prefill_tokens if pool_cfg.rollouts else None)
    return engine, Subscriber.from_config(store_url, engine, cfg.weights)


def pool_tasks(cfg: FlywheelConfig, split: Split = "train") -> list[Task]:
    """Synthetic tasks, an equal share per `synth.difficulties` level: `online.pool.num_tasks` training tasks, or
    `online.gate.coding_num_tasks` held-out ones (split "heldout": functions the training split never holds; the
    seeds of the RL loop's held-out set, pipeline/prepare.py)."""
    train = split == "train"
    n, diffs = (cfg.online.pool.num_tasks if train else cfg.online.gate.coding_num_tasks), cfg.synth.difficulties
    seed = cfg.seed if train else cfg.seed + 1
    tasks: list[Task] = []
    for i, d in enumerate(diffs):
        share = n // len(diffs) + (1 if i < n % len(diffs) else 0)
        if share:
            tasks += generate_tasks(share, seed=seed + 101 * i, split=split, difficulty=d, runner=cfg.synth.test_runner)
    return tasks


def build_pool(cfg: FlywheelConfig, engine: LocalEngine, tok: Any,
               on_group: Callable[[list[Trajectory]], None] | None = None) -> BackgroundRollouts:
    """Background rollouts on the serving engine: the RL loop's tasks, harness, agent loop and grading."""
    pool_dir = Path(cfg.run_dir) / "pool"
    chat = ChatFormat(tok, tools_for(cfg.env), cfg.model.tool_format)
    log_path = pool_dir / "trajectories.jsonl" if cfg.online.pool.log_trajectories else None
    return BackgroundRollouts(engine, chat, env_factory(cfg.env, pool_dir / "cache", cfg.env.sandbox),
                              pool_tasks(cfg), cfg.rollout, cfg.online.pool, log_path, seed=cfg.seed, on_group=on_group)


def build_coding_suite(cfg: FlywheelConfig, tok: Any) -> CodingSuite:
    """The gate's held-out coding tasks, graded like the RL loop's eval (eval.temperature)."""
    return CodingSuite(pool_tasks(cfg, "heldout"), ChatFormat(tok, tools_for(cfg.env), cfg.model.tool_format),
                       env_factory(cfg.env, Path(cfg.run_dir) / "gate" / "cache", cfg.env.sandbox), cfg.rollout,
                       num_samples=cfg.online.gate.coding_num_samples, seed=cfg.seed, temperature=cfg.eval.temperature)


@dataclass
class Service:
    cfg: FlywheelConfig
    elog: EventLog
    engine: Any  # LocalEngine, or VLLMEngine (inference.type = "vllm")
    state: ServingState
    learner: OnlineLearner | None
    pool: BackgroundRollouts | None = None
    key_file: str | None = None
    runner: web.AppRunner | None = None
    port: int = 0
    _stop: threading.Event | None = None
    _threads: tuple[threading.Thread, ...] = ()
    _tasks: tuple[asyncio.Task, ...] = ()
    _pool_stop: asyncio.Event | None = None

    @classmethod
    def build(cls, cfg: FlywheelConfig, model_dir: str | None = None, key_file: str | None = None) -> Service:
        pool_cfg = cfg.online.pool
        if cfg.inference.type == "vllm":
            check_vllm(cfg)
        if pool_cfg.rollouts and pool_cfg.max_background_rows > cfg.inference.max_batch_size:
            raise ValueError(f"online.pool.max_background_rows = {pool_cfg.max_background_rows} exceeds "
                             f"inference.max_batch_size = {cfg.inference.max_batch_size}; lower it (the rows it "
                             f"leaves free are kept for users)")
        if model_dir:
            model_dir = str(resolve_model_dir(model_dir))
            check_tokenizer_dir(Path(model_dir))
        check_port_free(cfg.online.serve.host, cfg.online.serve.port)
        model, tok = load_policy(cfg, model_dir)
        elog = EventLog(db_url_of(cfg))
        store_url = store_url_of(cfg)
        ensure_initial(elog, store_url, model, cfg.weights.anchor_every)
        learner_model = copy.deepcopy(model) if cfg.online.learner.enabled else None
        gate_model = copy.deepcopy(model) if cfg.online.learner.enabled else None
        engine, subscriber = serving_engine(cfg, model, tok, model_dir, store_url)
        follower = DeploymentFollower(elog, subscriber, engine)
        if isinstance(engine, LocalEngine):
            follower.step()  # serve the deployed version from the first request on (a restart may be at v > 0)
        state = ServingState(engine, tok, elog, cfg.online.serve, follower, tool_format=cfg.model.tool_format)
        learner = None
        inbox = GroupInbox(pool_cfg.max_waiting_groups) if pool_cfg.train else None
        if learner_model is not None:
            chat = ChatFormat(tok, None, cfg.model.tool_format)
            gate_engine = build_engine(cfg.inference, gate_model, tok, cfg.numerics.batch_invariant)
            gate = Gate(cfg.online.gate, PreferenceSuite(SuggestionTask(), chat, tok), gate_engine,
                        coding=build_coding_suite(cfg, tok) if pool_cfg.train else None)
            learner = OnlineLearner(learner_model, cfg.online, elog, store_url, gate, cfg.trainer,
                                    anchor_every=cfg.weights.anchor_every, groups=inbox,
                                    rollout_temperature=cfg.rollout.temperature)
        pool = build_pool(cfg, engine, tok, inbox.put if inbox is not None else None) if pool_cfg.rollouts else None
        state.pool, state.learner = pool, learner
        return cls(cfg, elog, engine, state, learner, pool, key_file=key_file)

    async def start(self, port_file: str | None = None) -> int:
        await self.engine.start()
        assert self.state.follower is not None
        if not isinstance(self.engine, LocalEngine):  # a vLLM server exists only now; it starts at version 0
            await asyncio.to_thread(self.state.follower.step)
        self.runner = web.AppRunner(build_app(self.state), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.cfg.online.serve.host, self.cfg.online.serve.port)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        key = ensure_key(self.elog, self.cfg, self.key_file)
        if key:
            print(f"flywheel serve: created API key 'default' (stored hashed; shown once): {key}", flush=True)
        self._tasks = (asyncio.ensure_future(self.state.follower.run(self.cfg.online.serve.deploy_poll_s)),)
        if self.pool is not None:
            # The sessions' sandbox calls (reset, tools, grading: seconds each) run in the loop's default executor,
            # as the handlers' event-log commits do; enough threads that rollouts never queue a user's commit.
            loop = asyncio.get_running_loop()
            sessions = self.cfg.online.pool.groups_in_flight * self.cfg.rollout.group_size
            loop.set_default_executor(ThreadPoolExecutor(
                max_workers=16 + 2 * min(self.cfg.rollout.concurrency, sessions), thread_name_prefix="flywheel-serve"))
            self._pool_stop = asyncio.Event()
            self._tasks += (asyncio.ensure_future(self.pool.run(self._pool_stop)),)
        self._stop = threading.Event()
        if self.learner is not None:
            t = threading.Thread(target=self.learner.run, args=(self._stop,), name="online-learner", daemon=True)
            t.start()
            self._threads = (t,)
        if port_file:  # written whole, then renamed: a reader never sees half of it
            tmp = Path(port_file).with_suffix(".tmp")
            tmp.write_text(json.dumps({"port": self.port, "host": self.cfg.online.serve.host}))
            tmp.replace(port_file)
        return self.port

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._pool_stop is not None:
            self._pool_stop.set()  # the pool cancels its sessions and closes its log
            await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        for t in self._threads:
            await asyncio.to_thread(t.join)
        if self.runner is not None:
            await self.runner.cleanup()
        await self.engine.stop()
        if self.learner is not None:
            self.learner.close()
        self.elog.close()
