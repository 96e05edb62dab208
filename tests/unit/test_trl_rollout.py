"""TRL's side of `flywheel bench trl` (bench/_trl_rollout.py), without TRL: the batching engine over a live HF model
and the rollout function's output, on the tiny preset and real sandboxed sessions."""

import asyncio
from types import SimpleNamespace

import torch

from flywheel.bench._trl_rollout import HarnessRollout, HFBatchEngine, flywheel_reward
from flywheel.config import FlywheelConfig, ModelConfig
from flywheel.policy.model import build_model
from flywheel.tasks.synth import generate_tasks
from flywheel.types import SamplingParams


def _model(chat):
    tok = chat.tokenizer
    return build_model(ModelConfig(preset="tiny", num_layers=2), len(tok), eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)


def test_batched_generation_returns_each_requests_tokens_and_their_logprobs(chat):
    model = _model(chat)
    engine = HFBatchEngine(model, chat.tokenizer.pad_token_id or 0, lambda: 3)
    prompts = [chat.encode_text("def f(x):"), chat.encode_text("a longer prompt, with more tokens in it")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=list(chat.stop_token_ids))

    async def both():
        return await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])

    torch.manual_seed(0)
    gens = asyncio.run(both())
    assert engine.tokens_sampled == sum(len(g.token_ids) for g in gens) > 0
    for p, g in zip(prompts, gens):
        assert 0 < len(g.token_ids) <= 12 and g.versions == [3] * len(g.token_ids)
        # the sampler's log-probs are the model's own on the unpadded sequence
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(own, torch.tensor(g.logprobs), atol=1e-4), (own, g.logprobs)


def test_the_rollout_function_gives_one_graded_session_per_prompt(chat, tmp_path):
    cfg = FlywheelConfig.model_validate({"env": {"tools": "core", "sandbox": "local"},
                                         "rollout": {"max_turns": 2, "max_new_tokens": 16}})
    tasks = generate_tasks(2, seed=5, split="train", difficulty="easy")
    rollout = HarnessRollout(cfg, {t.id: t for t in tasks}, chat, tmp_path)
    trainer = SimpleNamespace(model=_model(chat), state=SimpleNamespace(global_step=0), args=SimpleNamespace(bf16=False))
    prompts = [tasks[0].id] * 3 + [tasks[1].id] * 3  # TRL's sampler: each prompt num_generations times in a row
    out = rollout(prompts, trainer)
    assert all(len(out[k]) == 6 for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "flywheel_reward"))
    for prompt, completion, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"],
                                                  out["env_mask"]):
        assert prompt and len(completion) == len(logprobs) == len(mask) and mask[0] == 1
    assert rollout.sessions == 6 and flywheel_reward(prompts, None, out["flywheel_reward"]) == out["flywheel_reward"]


def test_trl_forward_passes_hold_what_one_flywheel_micro_batch_holds():
    from flywheel.bench.trl import _trl_rows
    from flywheel.config import load_config

    real = load_config("configs/real.toml", [])  # 2,048-token micro-batches of 2,048-token sessions: one each
    assert _trl_rows(real) == 1
    demo = load_config("configs/demo.toml", ["--trainer.micro_batch_tokens", str(6 * 512),
                                             "--rollout.max_total_tokens", "512", "--trainer.batch_size", "32"])
    assert _trl_rows(demo) == 4  # 6 fit, 4 is the largest that divides the step's 32 sessions


def test_a_real_runs_base_carries_its_own_tokenizer(tmp_path):
    from flywheel.bench.trl import _base

    base = tmp_path / "base_model"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_text("{}")
    assert _base(tmp_path) == (base, base)
    assert _base(base) == (base, base)  # the model directory itself
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    assert _base(tmp_path) == (base, tmp_path / "tokenizer")  # a demo run's trained tokenizer beside it
