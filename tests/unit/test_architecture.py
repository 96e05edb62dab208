"""The layer rule of docs/architecture.md, enforced on the real import graph (imports inside functions count)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "flywheel"

# Lowest first. A package may import its own modules and those of packages in lower layers, nothing else.
LAYERS = [
    {"types", "config", "background"},
    {"sandbox", "policy", "modeling", "weights"},
    {"tasks", "inference", "trainer"},
    {"envs", "rollout"},
    {"metrics"},
    {"orchestrator", "online"},
    {"pipeline", "redteam"},
    {"bench"},
    {"commands"},
    {"cli"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return rel.parts[0]


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return [(line, name.split(".")[1]) for line, name in out if name.startswith("flywheel.") and name.count(".")]


def test_every_package_has_a_layer():
    packages = {package_of(p) for p in SRC.rglob("*.py") if p.name != "__init__.py" or p.parent != SRC}
    packages -= {"__init__", "__main__"}
    assert packages <= set(LAYER), f"give these packages a layer in docs/architecture.md: {packages - set(LAYER)}"


def test_imports_only_point_down():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        pkg = package_of(path)
        if pkg not in LAYER:
            continue
        for line, target in imports(path):
            if target != pkg and target in LAYER and LAYER[target] >= LAYER[pkg]:
                wrong.append(f"{path.relative_to(SRC.parent)}:{line} ({pkg}, layer {LAYER[pkg]}) imports {target} "
                             f"(layer {LAYER[target]})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def _is_sibling_module(path: Path, module: str, name: str) -> bool:
    """`from flywheel.bench import _engines` in flywheel/bench/engine.py: a package's private helper module."""
    target = SRC.parent.joinpath(*module.split("."), name)
    return target.with_suffix(".py").is_file() and target.parent == path.parent


def test_no_private_name_crosses_a_module():
    """`from flywheel.x import _name`: a private name used by another module should be made public or moved
    (a package's private helper module, imported by its siblings, is fine)."""
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flywheel"):
                wrong += [f"{path.relative_to(SRC.parent)}:{node.lineno} {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                          and not _is_sibling_module(path, node.module, a.name)]
    assert not wrong, "\n".join(wrong)
