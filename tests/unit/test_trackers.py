"""Trackers beside metrics.jsonl: TensorBoard, W&B (offline) and MLflow (local file store) get the same keys and
values, and sample transcripts; each is read back from what it wrote on disk.

    .venv/bin/python -m pytest -q tests/unit/test_trackers.py
"""

from __future__ import annotations

import struct
import sys

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from flywheel.config import EnvConfig, MetricsConfig
from flywheel.envs.tools import tools_for
from flywheel.metrics.dashboard.transcript import TokenDecoder
from flywheel.metrics.log import MetricsLog, read_metrics
from flywheel.metrics.trackers import scalars
from flywheel.pipeline.scripted import scripted_group
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import default_corpus, train_tokenizer
from flywheel.tasks.synth import generate_tasks

ENV = EnvConfig(sandbox="local", tools="core")
RECORDS = [{"step": s, "rollout/reward_all": 0.1 * s, "loss": 1.0 / s, "mismatch/frac_outside_0.5_2": 0.01 * s,
            "flags/tests_edited": float(s == 2), "note": "text is not a curve", "bad": float("nan")} for s in (1, 2, 3)]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    tok = train_tokenizer(default_corpus(200_000), 512)
    task = generate_tasks(1, seed=3, split="train", difficulty="easy")[0]
    group = scripted_group(ChatFormat(tok, tools_for(ENV)), task, ENV, tmp_path_factory.mktemp("c"), version=1, seed=0)
    return group, TokenDecoder(tok.backend_tokenizer)


def write_run(run_dir, cfg: MetricsConfig, sample) -> dict[int, dict[str, float]]:
    group, decoder = sample
    log = MetricsLog.from_config(run_dir, cfg, run_name="unit", config={"trainer": {"lr": 1e-3}})
    for rec in RECORDS:
        log.write(rec)
    log.transcripts(3, group, decoder)
    log.close()
    return {r["step"]: scalars(r) for r in read_metrics(run_dir / "metrics.jsonl")}


def wandb_history(run_dir) -> list[dict]:
    """History rows of W&B's offline transaction log (a LevelDB-style log of protobuf records, 32 KiB blocks)."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    pos, buf, rows = 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        buf += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
    return rows


def test_wandb_offline_gets_the_jsonl_keys_and_transcripts(tmp_path, sample, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    expected = write_run(tmp_path, MetricsConfig(wandb=True), sample)
    rows = wandb_history(tmp_path)
    got = {int(r["_step"]): {k: float(v) for k, v in r.items() if not k.startswith(("_", "transcripts/"))}
           for r in rows}
    assert got == expected
    tables = {k: int(r["_step"]) for r in rows for k in r if k.endswith("/_type")}  # W&B merges a step's logs
    assert tables == {"transcripts/best/_type": 3, "transcripts/worst/_type": 3}
    (table,) = tmp_path.glob("wandb/offline-run-*/files/media/table/transcripts/best_3_*.table.json")
    assert "reward 1" in table.read_text() and "str_replace" in table.read_text()


def test_mlflow_file_store_gets_the_jsonl_keys_and_transcripts(tmp_path, sample):
    expected = write_run(tmp_path, MetricsConfig(mlflow=True), sample)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("flywheel").experiment_id])
    keys = set(run.data.metrics)
    assert keys == set(expected[1])
    got: dict[int, dict[str, float]] = {}
    for key in keys:
        for m in client.get_metric_history(run.info.run_id, key):
            got.setdefault(m.step, {})[key] = m.value
    assert got == expected
    assert run.data.params["trainer.lr"] == "0.001"
    worst = client.download_artifacts(run.info.run_id, "transcripts/worst/step_000003.txt", str(tmp_path / "dl"))
    text = open(worst).read()
    assert text.startswith("task ") and "tests_edited" in text and "[assistant]" in text


def test_tensorboard_gets_the_jsonl_keys_and_transcripts(tmp_path, sample):
    expected = write_run(tmp_path, MetricsConfig(tensorboard=True), sample)
    acc = EventAccumulator(str(tmp_path / "events"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    got: dict[int, dict[str, float]] = {}
    for key in acc.Tags()["scalars"]:
        for e in acc.Scalars(key):
            got.setdefault(e.step, {})[key] = pytest.approx(e.value, rel=1e-6)
    assert got == expected
    assert {"transcripts/best/text_summary", "transcripts/worst/text_summary"} <= set(acc.Tags()["tensors"])


@pytest.mark.parametrize("key,module,extra", [("wandb", "wandb", "wandb"), ("mlflow", "mlflow.tracking", "mlflow")])
def test_a_tracker_without_its_package_names_the_fix(tmp_path, monkeypatch, key, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ValueError, match=rf"flywheel\[{extra}\].*metrics.{key} = false"):
        MetricsLog.from_config(tmp_path, MetricsConfig(**{key: True}))
