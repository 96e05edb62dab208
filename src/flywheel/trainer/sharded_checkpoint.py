"""Sharded trainer checkpoints with torch.distributed.checkpoint (DCP): every rank writes its own shards.

    path = write_sharded(run_dir / "checkpoints", version, model, optimizer, group, trainer_state, extra_state)
    state = read_sharded(path, model, optimizer, group)   # group=None: a single process loads it (any world size)
    is_sharded(path)

Layout of `checkpoints/step_00000012/` (the same directory names as checkpoint.py, so `latest_checkpoint`,
`prune_checkpoints` and the loop's resume see both kinds):

    dcp/                    DCP files: one `__<rank>_0.distcp` per rank (its parameter and AdamW-moment shards),
                            `.metadata` (the global shapes and which bytes of which file hold each shard)
    rng_rank<r>.safetensors torch generator states of rank r; `rng_rank<r>.json` its python and numpy states
    state.json              {"format": "dcp", "world_size", "version", "trainer", "extra"} - written last

Why: at scale no rank can hold the whole model, optimizer state included, so no rank gathers; each writes what it
holds in parallel. DCP records global shapes and offsets, so a checkpoint saved by W ranks loads at any other
world size (a 2-rank checkpoint into a single unsharded process: tests/unit/test_sharded_trainer.py);
the state-dict keys are the model's parameter names, identical sharded or not. Atomicity as in checkpoint.py:
the ranks write into a hidden temporary sibling, rank 0 writes `state.json` after a barrier and renames the
directory into place. RNG states are per rank; at another world size rank r takes rank min(r, W-1)'s.
A single-process checkpoint (checkpoint.py) loads into a sharded trainer too (`load_single_process`): each rank
reads the full tensors once and keeps its shards - a one-off when a run grows from one device to a group.
Caveat: DCP's `.metadata` is a pickle (torch's format), so unlike checkpoint.py's files a DCP checkpoint must
come from a trusted source.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from flywheel.trainer.checkpoint import capture_rng, restore_rng
from flywheel.trainer.distributed import RankGroup

FORMAT = "dcp"
_PREFIX = "step_"


def is_sharded(path: str | Path) -> bool:
    p = Path(path) / "state.json"
    return p.is_file() and json.loads(p.read_text()).get("format") == FORMAT


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def write_sharded(root: str | Path, version: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  group: RankGroup, trainer_state: dict[str, Any], extra_state: dict[str, Any] | None = None) -> Path:
    """Every rank calls this (a collective); returns `root/step_<version>`. `extra_state` is rank 0's."""
    root = Path(root)
    final = root / f"{_PREFIX}{version:08d}"
    tmp_name = None
    if group.is_main:
        try:
            extra_json = json.dumps(extra_state or {})
        except TypeError as err:  # told to every rank below, so none is left waiting in a collective
            tmp_name = f"error: orchestrator state for the checkpoint must be JSON-serialisable: {err}"
        else:
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / f".tmp-{final.name}-{os.getpid()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            tmp_name = str(tmp)
    tmp_name = group.broadcast_object(tmp_name)
    if tmp_name.startswith("error: "):
        raise TypeError(tmp_name[len("error: "):])
    tmp = Path(tmp_name)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "dcp"), process_group=group.cpu_group)
    rng_tensors, rng_meta = capture_rng()
    save_file(rng_tensors, tmp / f"rng_rank{group.rank}.safetensors")
    (tmp / f"rng_rank{group.rank}.json").write_text(json.dumps(rng_meta))
    group.barrier()  # every rank's files are written
    if group.is_main:
        state = {"format": FORMAT, "world_size": group.world_size, "version": version, "trainer": trainer_state,
                 "extra": json.loads(extra_json)}
        (tmp / "state.json").write_text(json.dumps(state))
        _fsync_tree(tmp)
        if final.exists():
            old = root / f".old-{final.name}-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    group.barrier()  # nobody reads or prunes before the rename
    return final


def load_single_process(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a checkpoint.py checkpoint (`read_checkpoint`'s dict: full tensors, AdamW state keyed by parameter
    index) into a sharded model and its optimizer; every rank calls it. Parameter indices are those of
    `model.parameters()`, which FSDP keeps in order, so index i is the i-th trainable parameter's name."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    osd = state["optimizer"]
    if len(names) < len(osd["state"]):
        raise ValueError(f"the checkpoint has optimizer state for {len(osd['state'])} parameters, the model has "
                         f"{len(names)}; build the model with the run's config")
    full_osd: dict[str, Any] = {"state": {names[int(i)]: st for i, st in osd["state"].items()},
                "param_groups": [dict(g, params=[names[int(i)] for i in g["params"]]) for g in osd["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=full_osd,
                   options=StateDictOptions(full_state_dict=True))
    restore_rng(*state["rng"])


def read_sharded(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 group: RankGroup | None = None) -> dict[str, Any]:
    """Load model and optimizer shards (resharded to this world size), then this rank's RNG states; returns
    state.json ({"version", "trainer", "extra", "world_size"}). With `group=None` a single unsharded process
    loads it (every shard is read into its full tensor)."""
    p = Path(path)
    if not is_sharded(p):
        raise ValueError(f"'{p}' is not a sharded (DCP) checkpoint; pass a checkpoints/step_* directory written by "
                         "a sharded trainer")
    state = json.loads((p / "state.json").read_text())
    msd, osd = get_state_dict(model, optimizer)
    target: dict[str, Any] = {"model": msd, "optim": osd}
    if group is None:
        dcp.load(target, checkpoint_id=str(p / "dcp"), no_dist=True)
    else:
        dcp.load(target, checkpoint_id=str(p / "dcp"), process_group=group.cpu_group)
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    rank = 0 if group is None else group.rank
    src = min(rank, int(state["world_size"]) - 1)
    restore_rng(load_file(p / f"rng_rank{src}.safetensors"), json.loads((p / f"rng_rank{src}.json").read_text()))
    return state
