"""The harness: the tools a coding agent calls, with JSON schemas, over one sandboxed workspace.

    h = Harness(sandbox, cfg.env, task)
    r = h.call(ToolCall("view", {"path": "calc.py", "start": 1, "end": 20}))
    r.output, r.is_error, r.done           # every failure is an observation the model reads

Tools: `view` (a file with line numbers, or a range; a directory lists its files), `str_replace` (exactly
one occurrence), `write` (create/overwrite), `bash` (a shell command in the sandbox), `run_tests` (the
task's visible tests), `search` (a regex over the workspace), `submit` (end the session).

Why so: file tools run host-side on `sandbox.workspace` (no process per view: a session of 20 views costs
milliseconds), with every path resolved (symlinks included) and refused when it leaves the workspace;
shell commands run in the sandbox. Schemas and messages are deliberately terse — a whole easy session must
fit ~600 tokens for the tiny demo model. Nothing raises out of `call`: a bad argument, a missing file, an
ambiguous `str_replace`, a timeout all come back as `ToolResult(is_error=True)`. Every call is logged
(`log`) for the reward's anti-cheat checks (reads outside the workspace, tool-call spam).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs.outside import outside_references
from flywheel.types import Task, ToolCall, ToolCallError


def _schema(name: str, description: str, props: dict[str, str] | None = None,
            required: tuple[str, ...] = ()) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": {k: {"type": v} for k, v in (props or {}).items()}}
    if required:  # omitted when empty: every token of the tool list is paid on every session
        params["required"] = list(required)
    return {"name": name, "description": description, "parameters": params}


TOOLS: list[dict[str, Any]] = [
    _schema("view", "Show a file with line numbers.", {"path": "string", "start": "integer", "end": "integer"},
            ("path",)),
    _schema("str_replace", "Replace old with new in a file.", {"path": "string", "old": "string", "new": "string"},
            ("path", "old", "new")),
    _schema("write", "Write a file.", {"path": "string", "content": "string"}, ("path", "content")),
    _schema("bash", "Run a shell command.", {"command": "string"}, ("command",)),
    _schema("run_tests", "Run the visible tests."),
    _schema("search", "Grep a regex.", {"pattern": "string", "path": "string"}, ("pattern",)),
    _schema("submit", "Submit your fix."),
]
TOOL_NAMES = [t["name"] for t in TOOLS]
CORE_TOOLS = ("view", "str_replace", "run_tests", "submit")  # `tools = "core"`: ~40 % fewer prompt tokens


def number_lines(lines: list[str], start: int = 1, end: int | None = None) -> str:
    """`view`'s output: `N<TAB>line`, 1-based, lines start..end inclusive."""
    end = len(lines) if end is None else end
    return "\n".join(f"{n}\t{lines[n - 1]}" for n in range(start, end + 1))


def tools_for(cfg: EnvConfig) -> list[dict[str, Any]]:
    """The tool schemas a session offers: all seven, or the core four for tiny models (`cfg.tools`)."""
    return TOOLS if cfg.tools == "all" else [t for t in TOOLS if t["name"] in CORE_TOOLS]
_SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
# pytest without third-party plugin autoload starts in ~0.3 s instead of ~2.5 s here (hypothesis & co.),
# and plugins the agent might install cannot load.
# No .pytest_cache litter in the workspace either.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": "-p no:cacheprovider"}
MAX_FILE_BYTES = 20_000_000
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "node_modules", ".venv"}


@dataclass
class ToolResult:
    output: str
    is_error: bool = False
    done: bool = False


class ToolError(Exception):
    """A tool failed in a way the model should read (not a harness bug)."""


class OutsideWorkspace(ToolError):
    pass


def truncate(text: str, max_chars: int) -> str:
    """Head and tail of `text` with a marker saying how much was cut; unchanged when it fits."""
    if len(text) <= max_chars:
        return text
    marker = "\n[... {} characters truncated ...]\n"
    keep = max(0, max_chars - len(marker.format(len(text))))
    head, tail = keep // 2, keep - keep // 2
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else "")


def check_arguments(name: str, args: Any) -> dict[str, Any]:
    """Validate `args` against the tool's schema; lenient on integers written as strings."""
    if name not in _SCHEMAS:
        raise ToolError(f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
    if not isinstance(args, dict):
        raise ToolError(f"{name}: arguments must be a JSON object, got {type(args).__name__}")
    schema = _SCHEMAS[name]
    props = schema["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        allowed = ", ".join(props) or "none"
        raise ToolError(f"{name}: unknown argument(s) {', '.join(unknown)}; allowed: {allowed}")
    out: dict[str, Any] = {}
    for key in schema.get("required", []):
        if key not in args:
            raise ToolError(f"{name}: missing argument '{key}' ({props[key]['type']})")
    for key, value in args.items():
        want = props[key]["type"]
        if want == "integer":
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ToolError(f"{name}: argument '{key}' must be an integer, got {value!r}")
        elif want == "string" and not isinstance(value, str):
            raise ToolError(f"{name}: argument '{key}' must be a string, got {type(value).__name__}")
        out[key] = value
    return out


class Harness:
    """Tools over one sandbox. Counters: `num_calls`, `num_errors`, `calls_by_tool`; `log` for anti-cheat."""

    def __init__(self, sandbox: Any, cfg: EnvConfig, task: Task) -> None:
        self.sandbox = sandbox
        self.cfg = cfg
        self.task = task
        self.root = Path(sandbox.workspace).resolve()
        self.num_calls = 0
        self.num_errors = 0
        self.calls_by_tool: dict[str, int] = {}
        self.log: list[dict[str, Any]] = []
        self.submitted = False
        self.names = [t["name"] for t in tools_for(cfg)]

    # -- entry points ----------------------------------------------------------------------

    def call(self, call: ToolCall) -> ToolResult:
        t0 = time.perf_counter()
        self.num_calls += 1
        name = call.name if isinstance(call.name, str) else repr(call.name)
        self.calls_by_tool[name] = self.calls_by_tool.get(name, 0) + 1
        entry: dict[str, Any] = {"name": name, "outside": False}
        try:
            if self.submitted:
                raise ToolError("already submitted; the session is over")
            if name not in self.names:
                raise ToolError(f"unknown tool {name!r}; tools: {', '.join(self.names)}")
            args = check_arguments(name, call.arguments)
            entry["args"] = {k: (v[:200] if isinstance(v, str) else v) for k, v in args.items()}
            result = getattr(self, f"_tool_{name}")(args, entry)
        except OutsideWorkspace as err:
            entry["outside"] = True
            result = ToolResult(f"Error: {err}", is_error=True)
        except ToolError as err:
            result = ToolResult(f"Error: {err}", is_error=True)
        except Exception as err:  # noqa: BLE001 - a long run never dies of one tool call
            result = ToolResult(f"Error: {name} failed: {type(err).__name__}: {err}", is_error=True)
        if result.is_error:
            self.num_errors += 1
        entry.update(is_error=result.is_error, duration_s=round(time.perf_counter() - t0, 4))
        self.log.append(entry)
        return ToolResult(truncate(result.output, self.cfg.max_output_chars), result.is_error, result.done)

    def error_observation(self, err: ToolCallError) -> str:
        """What the model reads for a tool call it wrote but that could not be parsed or used."""
        self.num_calls += 1
        self.num_errors += 1
        self.log.append({"name": "<invalid>", "kind": err.kind, "is_error": True, "outside": False})
        text = f"Error ({err.kind}): {err.message}. Tools: {', '.join(self.names)}."
        return truncate(text, self.cfg.max_output_chars)

    # -- paths -----------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """`path` (relative to the workspace, or absolute inside it) resolved; refused when it leaves."""
        if not path or "\x00" in path:
            raise ToolError("path must be a non-empty string")
        p = Path(path)
        full = (p if p.is_absolute() else self.root / p).resolve()
        if full != self.root and self.root not in full.parents:
            raise OutsideWorkspace(f"{path} is outside the workspace; paths are relative to it")
        return full

    def rel(self, full: Path) -> str:
        return str(full.relative_to(self.root)) if full != self.root else "."

    def _files(self, start: Path) -> list[Path]:
        if start.is_file():
            return [start]
        out = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            out += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(".pyc")]
        return out

    # -- tools -----------------------------------------------------------------------------

    def _tool_view(self, args: dict[str, Any], entry: dict) -> ToolResult:
        full = self.resolve(args["path"])
        if full.is_dir():
            files = [self.rel(f) for f in self._files(full)]
            return ToolResult("\n".join(files) if files else "(empty directory)")
        if not full.exists():
            raise ToolError(f"no such file: {args['path']}")
        self._check_regular(full, args["path"])
        try:
            text = full.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{args['path']} is not a text file") from None
        lines = text.splitlines()
        if not lines:
            return ToolResult("(empty file)")
        start, end = args.get("start", 1), args.get("end", len(lines))
        if start < 1 or start > len(lines):
            raise ToolError(f"start={start} is out of range; {args['path']} has {len(lines)} lines")
        if end < start:
            raise ToolError(f"end={end} is before start={start}")
        end = min(end, len(lines))
        return ToolResult(number_lines(lines, start, end))

    def _tool_str_replace(self, args: dict[str, Any], entry: dict) -> ToolResult:
        full = self.resolve(args["path"])
        if not full.exists():
            raise ToolError(f"no such file: {args['path']}")
        self._check_regular(full, args["path"])
        old, new = args["old"], args["new"]
        if not old:
            raise ToolError("old must not be empty; use write to create a file")
        text = full.read_text(encoding="utf-8", errors="replace")
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old text not found in {args['path']} (whitespace and indentation must match)")
        if count > 1:
            raise ToolError(f"old text occurs {count} times in {args['path']}; include more lines to make it unique")
        self._write(full, text.replace(old, new, 1))
        return ToolResult(f"Edited {args['path']}.")

    def _tool_write(self, args: dict[str, Any], entry: dict) -> ToolResult:
        full = self.resolve(args["path"])
        if full.is_dir():
            raise ToolError(f"{args['path']} is a directory")
        if full.exists():
            self._check_regular(full, args["path"])
        content = args["content"]
        if len(content.encode()) > self.cfg.file_size_mb * 1024 * 1024:
            raise ToolError(f"content is larger than the {self.cfg.file_size_mb} MB file limit")
        self._write(full, content)
        return ToolResult(f"Wrote {args['path']} ({len(content.splitlines())} lines).")

    def _check_regular(self, full: Path, shown: str) -> None:
        """Only regular files are read or written host-side (a FIFO would block the harness)."""
        st = full.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{shown} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ToolError(f"{shown} is {st.st_size} bytes; files over {MAX_FILE_BYTES} bytes are not opened "
                            "(use bash with head/sed)")

    def _write(self, full: Path, text: str) -> None:
        """Host-side write that sandboxed commands (an unprivileged uid) can still edit afterwards."""
        new_dirs = [p for p in [full.parent, *full.parent.parents] if self.root in p.parents and not p.exists()]
        full.parent.mkdir(parents=True, exist_ok=True)
        for d in new_dirs:
            os.chmod(d, 0o777)
        full.write_text(text, encoding="utf-8")
        os.chmod(full, 0o666)

    def _run(self, command: str, env: dict[str, str] | None = None) -> ToolResult:
        res = self.sandbox.run(command, timeout_s=self.cfg.command_timeout_s, env=env)
        out = res.output.rstrip("\n")
        if res.timed_out:
            return ToolResult(f"{out}\n[timed out after {self.cfg.command_timeout_s:g}s]".lstrip("\n"), is_error=True)
        if res.returncode != 0:
            out = f"{out}\n[exit code {res.returncode}]".lstrip("\n")
        return ToolResult(out if out else "(no output)")

    def _tool_bash(self, args: dict[str, Any], entry: dict) -> ToolResult:
        command = args["command"]
        if not command.strip():
            raise ToolError("command is empty")
        refs = outside_references(command, str(self.root))
        if refs:
            entry["outside"] = True
            entry["outside_refs"] = refs[:5]
        return self._run(command)

    def _tool_run_tests(self, args: dict[str, Any], entry: dict) -> ToolResult:
        if not self.task.visible_tests:
            return ToolResult("This task has no visible tests.")
        targets = " ".join(shlex.quote(t) for t in self.task.visible_tests)
        return self._run(f"{self.task.test_command} {targets}", env=PYTEST_ENV)

    def _tool_search(self, args: dict[str, Any], entry: dict) -> ToolResult:
        try:
            rx = re.compile(args["pattern"])
        except re.error as err:
            raise ToolError(f"bad regex {args['pattern']!r}: {err}") from None
        start = self.resolve(args.get("path") or ".")
        if not start.exists():
            raise ToolError(f"no such file or directory: {args.get('path')}")
        hits: list[str] = []
        budget = self.cfg.max_output_chars
        for f in self._files(start):
            try:
                st = os.lstat(f)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > 2_000_000:
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), start=1):
                if rx.search(line):
                    hits.append(f"{self.rel(f)}:{n}: {line.strip()[:200]}")
                    budget -= len(hits[-1])
            if budget < 0:
                break
        return ToolResult("\n".join(hits) if hits else "No matches.")

    def _tool_submit(self, args: dict[str, Any], entry: dict) -> ToolResult:
        self.submitted = True
        return ToolResult("Submitted.", done=True)

    def metrics(self) -> dict[str, float]:
        return {"num_tool_calls": self.num_calls, "num_tool_errors": self.num_errors,
                "num_outside_refs": sum(1 for e in self.log if e.get("outside"))}
