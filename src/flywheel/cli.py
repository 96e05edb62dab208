"""The `flywheel` command line: thin entrypoints, heavy imports only after parsing.

    flywheel --help
    flywheel <command> --help
    flywheel --version
    flywheel --debug <command> ...        # or FLYWHEEL_DEBUG=1: a traceback for an unexpected error

Subcommands are the modules of `flywheel.commands`, discovered at start-up: each defines `HELP`,
`add_arguments(parser)` and `run(args) -> int`, imports nothing heavy at module level, and sets
`ACCEPTS_OVERRIDES = True` when it takes a config (its first positional argument) and dotted config overrides
(`--trainer.lr 3e-6` or `--trainer.lr=3e-6`, any key of docs/config.md), which arrive as `args.overrides`.
A command exists only once its capability does.

Errors: a user's mistake (`UserError`, `ConfigError`, a port in use, a `SystemExit` with a message) is one line
on stderr, `flywheel <command>: what to change`, and exit code 2. Anything else is a bug: one line saying so and
exit code 1, with the traceback under `--debug`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import sys
import traceback
from types import ModuleType

from flywheel import __version__, commands
from flywheel.config import FlywheelConfig, UserError
from flywheel.config.base import Section

OVERRIDES_HELP = """\
config overrides: any config key as --section.key VALUE or --section.key=VALUE, after the other arguments
  (e.g. --trainer.lr 3e-6 --run_dir runs/try2); every key, its default and meaning: docs/config.md.
  Sections and top-level keys: {keys}"""


def config_keys() -> tuple[set[str], list[str]]:
    """(top-level scalar keys, section names) of the config: what an override may start with."""
    top, sections = set(), []
    for name, info in FlywheelConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            sections.append(name)
        else:
            top.add(name)
    return top, sections


def option_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its subcommands' parsers (argparse keeps them in `_actions`)."""
    names: set[str] = set()
    for action in parser._actions:
        names.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                names |= option_names(child)
    return names


def split_overrides(argv: list[str], top_level: set[str]) -> tuple[list[str], list[str]]:
    """Separate `--section.key VALUE` / `--key=VALUE` config overrides from a command's own arguments.

    An override is an option whose name has a dot, or is one of `top_level` (the top-level config keys the
    command has no option of its own for: `--run_dir`, `--seed`); its value is the next argument unless written
    with `=`, so `--trainer.lr -1` and `--online.learner.enabled false` work wherever they stand."""
    rest: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if name and ("." in name or name in top_level):
            if "=" in arg:
                overrides.append(arg)
                i += 1
            elif i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError(f"override {arg} needs a value: {arg} VALUE or {arg}=VALUE")
            else:
                overrides += [arg, argv[i + 1]]
                i += 2
            continue
        if arg == "--":
            rest += argv[i:]
            break
        rest.append(arg)
        i += 1
    return rest, overrides


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType], dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="flywheel", description="Asynchronous RL for agentic coding models.")
    parser.add_argument("--version", action="version", version=f"flywheel {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error "
                        "(also FLYWHEEL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    parsers: dict[str, argparse.ArgumentParser] = {}
    top, sections = config_keys()
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"flywheel.commands.{info.name}")
        name = getattr(mod, "NAME", info.name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of an unexpected error (also FLYWHEEL_DEBUG=1)")
        mod.add_arguments(p)
        if getattr(mod, "ACCEPTS_OVERRIDES", False):
            own = {o.lstrip("-") for o in option_names(p)}
            p.epilog = OVERRIDES_HELP.format(keys=", ".join(sorted(sections) + sorted(top - own)))
        modules[name], parsers[name] = mod, p
    return parser, modules, parsers


def command_index(argv: list[str], names: set[str]) -> int:
    """Where the subcommand stands in argv (after global options), or -1."""
    for i, arg in enumerate(argv):
        if arg in names:
            return i
        if not arg.startswith("-"):
            return -1
    return -1


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace, ModuleType | None]:
    """(parser, args with `.overrides`, the command's module or None): what `main` runs. A bad override is a
    UserError; argparse's own errors exit 2 with the usage line."""
    parser, modules, parsers = build_parser()
    at = command_index(argv, set(modules))
    overrides: list[str] = []
    if at >= 0:
        top, _ = config_keys()
        own = {o.lstrip("-") for o in option_names(parsers[argv[at]])}
        tail, overrides = split_overrides(argv[at + 1:], top - own)
        argv = argv[: at + 1] + tail
    args = parser.parse_args(argv)
    mod = modules[args.command] if args.command else None
    if overrides and mod is not None and not getattr(mod, "ACCEPTS_OVERRIDES", False):
        raise UserError(f"takes no config overrides, got {' '.join(overrides)}; see `flywheel {args.command} --help`")
    args.overrides = overrides
    return parser, args, mod


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, args, mod = parse(argv)
    except UserError as err:
        names = [a for a in argv if not a.startswith("-")]
        return fail(names[0] if names else "", str(err))
    if mod is None:
        parser.print_help()
        return 0
    debug = bool(getattr(args, "debug", False) or os.environ.get("FLYWHEEL_DEBUG", "") not in ("", "0"))
    try:
        return int(mod.run(args) or 0)
    except UserError as err:
        return fail(args.command, str(err))
    except SystemExit as exc:  # a command's own one-line refusal: raise SystemExit("flywheel x: ...")
        if isinstance(exc.code, str):
            return fail(args.command, exc.code)
        raise
    except KeyboardInterrupt:
        print(f"flywheel {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            option = getattr(mod, "PORT_OPTION", "--port")
            return fail(args.command, f"the address is in use ({err.strerror or err}); another process listens on "
                        f"that port: stop it, or pass another {option} (0 picks a free one)")
        return bug(args.command, debug)
    except Exception:
        return bug(args.command, debug)


def fail(command: str, message: str) -> int:
    """One line on stderr, prefixed with the command unless the message names it already; exit code 2."""
    print(message if message.startswith("flywheel ") else f"flywheel {command}: {message}", file=sys.stderr)
    return 2


def bug(command: str, debug: bool) -> int:
    """An unexpected exception: the traceback under --debug, else its last line and how to see the rest."""
    kind, err, _ = sys.exc_info()
    if debug:
        traceback.print_exc()
    else:
        name = kind.__name__ if kind else "error"
        print(f"flywheel {command}: unexpected error: {name}: {err}\n  (a bug in flywheel, or a case it does not "
              f"check yet: rerun with --debug or FLYWHEEL_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
