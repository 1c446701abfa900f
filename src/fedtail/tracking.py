"""Experiment tracking besides the run folder: ``--log tensorboard[:DIR]``, ``--log mlflow[:URI]``.

``--log tensorboard`` writes each evaluation of the run as TensorBoard scalars, at the round as
the step, into ``OUT/tensorboard`` (``tensorboard:DIR``: into DIR; a run without a folder needs
DIR); ``tensorboard --logdir OUT`` (or a sweep's folder) shows them. What is written:

- ``accuracy/personalized`` (the mean over clients), ``accuracy/personalized_weighted``,
  ``accuracy/personalized_p10``, ``accuracy/personalized_std``, ``accuracy/global``,
  ``accuracy/head``, ``accuracy/middle``, ``accuracy/tail``, and ``accuracy/NAME`` for each named
  accuracy (GLDP's ``gp``, ``lp``, ``head``);
- ``train/loss`` (the round's), ``train/samples`` (trained so far), ``cost/elapsed_s``,
  ``cost/bytes_down`` and ``cost/bytes_up`` (so far);
- histograms ``clients/accuracy`` (each client's accuracy) and ``classes/accuracy`` (each
  class's), and the per-class accuracies as a Markdown table (text ``classes``);
- the resolved config as JSON text (``config``), at step 0.

The tracking is a :class:`~fedtail.engine.callbacks.Callback`: it reads the rows the run folder's
``metrics.jsonl`` gets, so the two agree. A resumed run continues the same log: the writer drops
what the stopped run wrote after its checkpoint's round (TensorBoard's ``purge_step``). Tracking
never changes a run's results, and a sweep ignores the setting. The library is an optional
dependency: ``pip install tensorboard`` (or ``fedtail[tensorboard]``).

``--log mlflow[:URI]`` logs the run to MLflow: by default into a SQLite store under the run
folder (``OUT/mlflow.db``, artifacts in ``OUT/mlartifacts``; ``mlflow ui --backend-store-uri
sqlite:///OUT/mlflow.db`` shows it, no server needed), or into the tracking URI given (a server,
a shared ``sqlite:///...`` file). One fedtail run is one MLflow run: its params are the resolved
config, flattened (``train.lr``, ``options.mu``, ...); its metrics are the scalars above, at the
round as the step; when it ends, ``config.json``, ``summary.json``, ``partition.json`` and the
accuracy curve (``accuracy.png``) are its artifacts and it is marked finished (failed when the run
breaks). The experiment is the sweep file for a sweep's runs (its run name
``SETTING/METHOD/seedK``) and ``fedtail`` otherwise (the run name: the folder's name).
A resumed run continues the same MLflow run (its id is kept in ``OUT/mlflow_run_id``); rounds the
stopped run logged after its checkpoint stay in the metric history, before the resumed run's values
of the same steps (MLflow keeps every logged value). ``pip install mlflow-skinny`` (or
``fedtail[mlflow]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtail.engine.callbacks import Callback
from fedtail.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from fedtail.config import RunConfig
    from fedtail.engine.simulation import Simulation

KINDS = ("tensorboard", "mlflow")
EXPERIMENT_ENV, RUN_NAME_ENV = "FEDTAIL_EXPERIMENT", "FEDTAIL_RUN_NAME"  # set by a sweep for its runs
SCALARS = {
    "personalized_acc": "accuracy/personalized",
    "personalized_acc_weighted": "accuracy/personalized_weighted",
    "personalized_acc_p10": "accuracy/personalized_p10",
    "personalized_acc_std": "accuracy/personalized_std",
    "global_acc": "accuracy/global",
    "head_acc": "accuracy/head",
    "middle_acc": "accuracy/middle",
    "tail_acc": "accuracy/tail",
    "train_loss": "train/loss",
    "samples_trained": "train/samples",
    "elapsed_s": "cost/elapsed_s",
    "bytes_down": "cost/bytes_down",
    "bytes_up": "cost/bytes_up",
}


def parse_log(spec: str) -> tuple[str, str | None]:
    """``KIND[:TARGET]`` of ``--log`` (a ValueError names the kinds there are)."""
    kind, _, target = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"--log {spec!r}: unknown kind {kind!r}; one of {', '.join(KINDS)} (as KIND, KIND:DIR or mlflow:URI)")
    return kind, target or None


def trackers(config: "RunConfig", out: Path | None) -> list[Callback]:
    """The callbacks of the run's ``--log`` settings; bad input (a missing library, no place to
    write) raises :class:`~fedtail.errors.ConfigError` before anything is written."""
    found: list[Callback] = []
    for spec in config.log:
        kind, target = parse_log(spec)
        if kind == "tensorboard":
            if target is None and out is None:
                raise ConfigError(f"--log {spec}: a run without an out folder needs --log tensorboard:DIR")
            found.append(TensorBoard(Path(target) if target else Path(out) / "tensorboard", config))
        elif kind == "mlflow":
            if target is None and out is None:
                raise ConfigError(f"--log {spec}: a run without an out folder needs --log mlflow:URI")
            found.append(MLflow(target, None if out is None else Path(out), config))
    return found


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--log tensorboard needs the tensorboard package: pip install tensorboard "
                          "(or pip install 'fedtail[tensorboard]')") from None  # fmt: skip
    return SummaryWriter


class TensorBoard(Callback):
    """Each evaluation's metrics as TensorBoard events in ``log_dir`` (module docstring)."""

    def __init__(self, log_dir: Path, config: "RunConfig") -> None:
        self.writer_class = _summary_writer()  # fails now, before the run, when the library is missing
        self.log_dir = Path(log_dir)
        self.config = config
        self.writer: Any = None

    def on_run_start(self, sim: "Simulation", first_round: int) -> None:
        # resumed: events after the checkpoint's round (written before the stop) are dropped
        self.writer = self.writer_class(str(self.log_dir), purge_step=first_round + 1 if first_round else None)
        if first_round == 0:
            text = json.dumps(self.config.model_dump(mode="json"), indent=2)
            self.writer.add_text("config", f"```\n{text}\n```", 0)

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        import numpy as np

        w, step = self.writer, int(row["round"])
        for key, tag in SCALARS.items():
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                w.add_scalar(tag, value, step)
        for name, metrics in (row.get("named") or {}).items():
            if isinstance(metrics.get("personalized_acc"), (int, float)):
                w.add_scalar(f"accuracy/{name}", metrics["personalized_acc"], step)
        per_client = [a for a in row.get("per_client_acc") or [] if a is not None]
        if per_client:
            w.add_histogram("clients/accuracy", np.asarray(per_client, dtype=np.float64), step)
        per_class = row.get("per_class_acc") or []
        shown = [a for a in per_class if a is not None]
        if shown:
            w.add_histogram("classes/accuracy", np.asarray(shown, dtype=np.float64), step)
            cells = " | ".join("—" if a is None else f"{100 * a:.2f}" for a in per_class)
            head = " | ".join(str(c) for c in range(len(per_class)))
            w.add_text("classes", f"| class | {head} |\n|---|{'---|' * len(per_class)}\n| accuracy % | {cells} |", step)
        w.flush()

    def on_run_end(self, sim: "Simulation", summary: dict[str, Any]) -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _mlflow():
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError("--log mlflow needs the mlflow package: pip install mlflow-skinny "
                          "(or pip install 'fedtail[mlflow]')") from None  # fmt: skip
    return MlflowClient, Metric, Param


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as MLflow params: nested keys dotted, values as JSON (lists, null), at most
    MLflow's 6000 characters each."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flat_params(value, name + ".")
        else:
            out[name] = (value if isinstance(value, str) else json.dumps(value))[:6000]
    return out


class MLflow(Callback):
    """The run as one MLflow run (module docstring)."""

    def __init__(self, uri: str | None, out: Path | None, config: "RunConfig") -> None:
        import os

        self.client_class, self.metric, self.param = _mlflow()  # fails now, before the run, when missing
        self.out = out
        self.artifacts = None
        if uri is None:
            assert out is not None
            uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
            self.artifacts = (out / "mlartifacts").resolve().as_uri()
        self.uri = uri
        self.config = config
        self.experiment = os.environ.get(EXPERIMENT_ENV) or "fedtail"
        self.run_name = os.environ.get(RUN_NAME_ENV) or (out.name if out is not None else config.algorithm)
        self.client: Any = None
        self.run_id: str | None = None
        self.ended = False

    def _id_file(self) -> Path | None:
        return None if self.out is None else self.out / "mlflow_run_id"

    def on_run_start(self, sim: "Simulation", first_round: int) -> None:
        import time

        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self.client = client = self.client_class(tracking_uri=self.uri)
        id_file = self._id_file()
        if first_round and id_file is not None and id_file.is_file():  # resumed: the same MLflow run
            self.run_id = id_file.read_text().strip()
            client.update_run(self.run_id, status="RUNNING")
            return
        found = client.get_experiment_by_name(self.experiment)
        experiment = found.experiment_id if found else client.create_experiment(self.experiment, artifact_location=self.artifacts)
        tags = {"fedtail.algorithm": self.config.algorithm, "fedtail.out": str(self.out or "")}
        self.run_id = client.create_run(experiment, run_name=self.run_name, tags=tags, start_time=int(time.time() * 1000)).info.run_id
        if id_file is not None:
            id_file.write_text(self.run_id + "\n")
        params = [self.param(k, v) for k, v in flat_params(self.config.model_dump(mode="json")).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.run_id, params=params[start : start + 100])

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        import time

        stamp, step = int(time.time() * 1000), int(row["round"])
        metrics = [self.metric(tag, float(row[key]), stamp, step) for key, tag in SCALARS.items()
                   if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)]  # fmt: skip
        for name, values in (row.get("named") or {}).items():
            if isinstance(values.get("personalized_acc"), (int, float)):
                metrics.append(self.metric(f"accuracy/{name}", float(values["personalized_acc"]), stamp, step))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def on_run_end(self, sim: "Simulation", summary: dict[str, Any]) -> None:
        import tempfile

        from fedtail.report.plots import plot_accuracy_curves

        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
            files = [folder / "summary.json"]
            if self.out is not None:
                files += [self.out / name for name in ("config.json", "partition.json") if (self.out / name).is_file()]
            png = folder / "accuracy.png"
            rows = [r for r in sim.record.rows if isinstance(r.get("personalized_acc"), (int, float))]
            if rows and plot_accuracy_curves({("run", self.run_name): [rows]}, ["run"], [self.run_name], png):
                files.append(png)
            for path in files:
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status="FINISHED")
        self.ended = True

    def close(self) -> None:
        if self.client is not None and self.run_id is not None and not self.ended:
            self.client.set_terminated(self.run_id, status="FAILED")  # the run broke (or was stopped)
            self.ended = True
