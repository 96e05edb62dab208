"""Experiment trackers beside metrics.jsonl: TensorBoard, Weights & Biases, MLflow — one key name everywhere.

    trackers = build_trackers(cfg.metrics, run_dir, run_name="demo", config=cfg.model_dump(mode="json"))
    for t in trackers:
        t.log_metrics(step, {"rollout/reward_all": 0.4})      # the key metrics.jsonl uses, unchanged
        t.log_text(step, "transcripts", text)                 # sample transcripts
        t.close()

Why so: people already watch runs in one of these three; each gets exactly the keys of metrics.jsonl (all three
accept `/` in names), so a curve found in the dashboard has the same name in W&B or MLflow. Each is an optional
extra (`pip install 'flywheel[wandb]'`, `'flywheel[mlflow]'`) imported only when enabled — they are heavy
(seconds to import) and a run that does not use them should not pay for it. W&B defaults to offline mode (the
run lands in `<run_dir>/wandb/`, `wandb sync` uploads it later); MLflow defaults to a file store in
`<run_dir>/mlruns` (`mlflow ui --backend-store-uri <run_dir>/mlruns` shows it; any tracking URI works).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Literal, Protocol

from flywheel.config import MetricsConfig

SKIP_KEYS = ("step", "time")  # the x axis and the wall-clock stamp are not curves


class Tracker(Protocol):
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_text(self, step: int, name: str, text: str) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record, under their own names (bools and None are left out)."""
    return {k: float(v) for k, v in record.items() if k not in SKIP_KEYS and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _missing(extra: str, package: str, key: str) -> ValueError:
    return ValueError(f"metrics.{key} = true needs the {package} package: pip install 'flywheel[{extra}]', "
                      f"or set metrics.{key} = false")


class TensorBoardTracker:
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _missing("tensorboard", "tensorboard", "tensorboard") from err
        self.writer = SummaryWriter(str(run_dir / "events"))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_text(self, step: int, name: str, text: str) -> None:
        self.writer.add_text(name, f"```\n{text}\n```", step)  # markdown: keep the transcript's layout

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, run_name: str, project: str, mode: Literal["offline", "online"],
                 config: dict | None):
        try:
            import wandb
        except ImportError as err:
            raise _missing("wandb", "wandb", "wandb") from err
        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_name, dir=str(run_dir), mode=mode, config=config or {},
                              reinit="create_new")
        self._texts: dict[str, list[list[Any]]] = {}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_text(self, step: int, name: str, text: str) -> None:
        rows = self._texts.setdefault(name, [])
        rows.append([step, text])  # one growing table per name, as W&B shows tables
        self.run.log({name: self.wandb.Table(columns=["step", "transcript"], data=list(rows))}, step=step)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # waits for the service to write the run out (finish alone may return first)


class MlflowTracker:
    def __init__(self, run_dir: Path, run_name: str, tracking_uri: str, experiment: str, config: dict | None):
        uri = tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store working but asks for an explicit opt-in; a local file store is what
            # needs no server and no database, so flywheel opts in for it (any other URI is used as given)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise _missing("mlflow", "mlflow-skinny", "mlflow") from err
        self.metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        for k, v in _flatten(config or {}).items():
            self.client.log_param(self.run_id, k, str(v)[:500])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        stamp = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[self.metric(k, v, stamp, step) for k, v in metrics.items()])

    def log_text(self, step: int, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"{name}/step_{step:06d}.txt")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def build_trackers(cfg: MetricsConfig, run_dir: str | Path, run_name: str = "run",
                   config: dict | None = None) -> list[Tracker]:
    """The trackers `cfg` enables, each writing under `run_dir` unless told otherwise."""
    run_dir = Path(run_dir)
    out: list[Tracker] = []
    if cfg.tensorboard:
        out.append(TensorBoardTracker(run_dir))
    if cfg.wandb:
        out.append(WandbTracker(run_dir, run_name, cfg.wandb_project, cfg.wandb_mode, config))
    if cfg.mlflow:
        out.append(MlflowTracker(run_dir, run_name, cfg.mlflow_tracking_uri, cfg.mlflow_experiment, config))
    return out
