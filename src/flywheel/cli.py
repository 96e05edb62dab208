"""The `flywheel` command line: thin entrypoints, heavy imports only after parsing.

    flywheel --help
    flywheel <command> --help

Subcommands are the modules of `flywheel.commands`, discovered at start-up: each defines `HELP`,
`add_arguments(parser)` and `run(args) -> int`, imports nothing heavy at module level, and sets
`ACCEPTS_OVERRIDES = True` when it takes dotted config overrides (`--trainer.lr 3e-6`), which
arrive as `args.overrides`. A command exists only once its capability does.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from flywheel import commands
from flywheel.config import ConfigError


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = argparse.ArgumentParser(prog="flywheel", description="Asynchronous RL for agentic coding models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"flywheel.commands.{info.name}")
        name = getattr(mod, "NAME", info.name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    mod = modules[args.command]
    if extra and not getattr(mod, "ACCEPTS_OVERRIDES", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return int(mod.run(args) or 0)
    except ConfigError as err:
        print(f"flywheel {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flywheel {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
