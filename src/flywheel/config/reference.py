"""The config reference: docs/config.md is the output of `python -m flywheel.config > docs/config.md`."""

from __future__ import annotations

import json

from pydantic import BaseModel

from flywheel.config import FlywheelConfig


def reference_markdown() -> str:
    """The config reference (docs/config.md is this text): every section, key, type, default and description."""
    lines = ["# Config reference", "",
             "Generated from `src/flywheel/config/` by `python -m flywheel.config > docs/config.md`.",
             "Every key can be set in a TOML file or overridden on the command line: `--section.key VALUE`.", ""]

    def section(title: str, model: type[BaseModel]) -> None:
        lines.extend([f"## `{title}`", "", (model.__doc__ or "").strip(), "",
                      "| key | type | default | description |", "|---|---|---|---|"])
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):  # a nested section: its own heading, once
                path = name if title == "(top level)" else f"{title}.{name}"
                desc = "; ".join(filter(None, [f.description, f"its keys: [`{path}`](#{path.replace('.', '')})"]))
                lines.append(f"| `{name}` | section | | {desc} |")
                continue
            bounds = [f"{k} {getattr(m, k)}" for m in f.metadata for k in ("gt", "ge", "lt", "le")
                      if getattr(m, k, None) is not None]
            typ = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
            desc = (f.description or "") + (f" ({', '.join(bounds)})" if bounds else "")
            default = f.get_default(call_default_factory=True)
            lines.append(f"| `{name}` | `{typ}` | `{json.dumps(default)}` | {desc} |")
        lines.append("")

    def walk(prefix: str, model: type[BaseModel]) -> None:
        """Each section once, depth first: a parent, then its nested sections (trainer, trainer.mesh, ...)."""
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                section(prefix + name, f.annotation)
                walk(prefix + name + ".", f.annotation)

    section("(top level)", FlywheelConfig)
    walk("", FlywheelConfig)
    return "\n".join(lines)

