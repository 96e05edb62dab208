"""Every `flywheel …` command in a fenced block of README.md and docs/*.md, and in each command's --help text
(its module docstring), parses as written: the subcommand exists, its arguments and choices are right, and its
config overrides name real keys with valid values.

What a full run of each would take is covered elsewhere: tests/integration/test_first_hour.py runs the README's
path (train, then eval and serve on final_model) for real. Here each command goes through the same parser
`flywheel` uses (cli.parse), and the config it names (or the defaults) through load_config with its overrides.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from flywheel import cli
from flywheel.config import load_config

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+")


def blocks(path: Path) -> list[str]:
    """The fenced blocks of a Markdown file, or the docstring of a command module (its --help text)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [ast.get_docstring(ast.parse(text)) or ""]
    return FENCE.findall(text)


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `flywheel`) for each command line in a fenced block (continuations joined)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "src/flywheel/commands").glob("*.py"))]:
        for block in blocks(path):
            for line in block.replace("\\\n", " ").splitlines():
                line = ENV_PREFIX.sub("", line.strip().removeprefix("$ "))
                if not line.startswith("flywheel "):
                    continue
                for variant in variants(line):
                    words = shlex.split(variant, comments=True)
                    cut = next((i for i, w in enumerate(words) if w in ("|", "&&", ";", ">", "&")), len(words))
                    argv = words[1:cut]
                    if argv and argv[-1] == "..." and variant.rstrip().endswith("..."):
                        argv.pop()  # "and more options": the rest must parse
                    out.append((f"{path.relative_to(ROOT)}: {variant[:90]}", argv))
    return out


def variants(line: str) -> list[str]:
    """The usage notation expanded: `[--opt X]` both left out and given, `a|b|c` each alternative."""
    line = line.split(" #", 1)[0]
    out = [re.sub(r"\s*\[[^\]]*\]", "", line)]
    if "[" in line:
        out.append(line.replace("[", "").replace("]", ""))
    expanded = []
    for v in out:
        alt = re.search(r"(?<=\s)(\w+(?:\|\w+)+)(?=\s|$)", v)
        expanded += [v[:alt.start()] + a + v[alt.end():] for a in alt.group(1).split("|")] if alt else [v]
    return expanded


COMMANDS = doc_commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses_as_written(where, argv, monkeypatch):
    monkeypatch.chdir(ROOT)  # the docs' paths (configs/demo.toml) are relative to the repository
    try:
        _, args, mod = cli.parse(argv)
    except SystemExit as exc:  # argparse: an unknown option, a missing argument, a bad choice (0: --version)
        assert exc.code == 0, f"{where}: does not parse (exit {exc.code})"
        return
    assert mod is not None, where
    if getattr(mod, "ACCEPTS_OVERRIDES", False):
        config = getattr(args, "config_opt", None) or getattr(args, "config", None)
        if config and str(config).startswith("configs/"):
            assert (ROOT / config).is_file(), f"{where}: {config} is not in configs/"
        load_config(config if config and (ROOT / config).is_file() else None, args.overrides)
