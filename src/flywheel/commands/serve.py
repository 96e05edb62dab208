"""Serve the policy over an OpenAI-compatible API and learn from users' feedback (docs/online.md).

    flywheel serve configs/online.toml                         # http://127.0.0.1:8470/v1, learner on
    flywheel serve --model runs/demo/final_model --online.learner.enabled false
    flywheel serve configs/online.toml --online.serve.port 0 --port-file port.json --key-file key.txt
    flywheel serve --model runs/demo/final_model --inference.type vllm   # the same API through a vLLM server

One process: the engine, the HTTP API (/v1/chat/completions, /v1/feedback, /v1/models), the durable event log
(online.serve.db_url; SQLite WAL by default), the deploy follower, and the online learner with its gate. With
inference.type = "vllm" the engine is a vLLM server launched from inference.vllm.python (.venv-vllm).
"""

from __future__ import annotations

import argparse

HELP = "serve the policy (OpenAI-compatible API), log feedback, learn online, deploy behind a gate"
ACCEPTS_OVERRIDES = True
PORT_OPTION = "--online.serve.port"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, help="config file (TOML); defaults apply without one")
    p.add_argument("--model", default=None, help="a saved model directory with its tokenizer, or a Hub id in the "
                   "local HF cache (default: the config's model preset and tokenizer)")
    p.add_argument("--key-file", default=None, help="write the API key created at the first start here (mode 600)")
    p.add_argument("--port-file", default=None, help="write {\"port\": N} here once listening (for --online.serve.port 0)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from flywheel.config import load_config
    from flywheel.online.service import Service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(args.config, args.overrides)
    try:
        service = Service.build(cfg, args.model, args.key_file)
    except ValueError as err:
        raise SystemExit(f"flywheel serve: {err}") from None

    async def main() -> None:
        try:
            port = await service.start(args.port_file)
        except (ValueError, RuntimeError) as err:  # the engine did not start (a vLLM server: its log's tail)
            await service.stop()
            raise SystemExit(f"flywheel serve: {err}") from None
        print(f"flywheel serve: listening on http://{cfg.online.serve.host}:{port}/v1 (model "
              f"'{cfg.online.serve.model_name}', {cfg.inference.type} engine, weight version {service.engine.version}, "
              f"learner {'on' if service.learner else 'off'}, background rollouts {'on' if service.pool else 'off'})",
              flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        await service.stop()

    asyncio.run(main())
    return 0
