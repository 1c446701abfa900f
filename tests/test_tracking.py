"""--log tensorboard: what TensorBoard's own reader finds agrees with metrics.jsonl, resumed runs continue one log."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

import fedtail
from fedtail.engine.callbacks import OnRound
from fedtail.errors import ConfigError
from fedtail.report.runfiles import config_diff
from fedtail.runner import run_to_folder
from helpers import tiny_config

TINY = dict(dataset="synthetic", model="mlp", clients=6, rounds=4, fraction=0.5, batch_size=16, lr=0.05,
            set={"dataset_options.num_classes": 5})  # fmt: skip


# the [tracking] extra, which `make test` installs; the MLflow tests and the error tests do not need it
TENSORBOARD = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")


def events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def rows_of(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@TENSORBOARD
def test_tensorboard_holds_each_evaluation_as_metrics_jsonl_does(tmp_path):
    out = tmp_path / "r"
    fedtail.run(algorithm="fedavg", out=out, log=["tensorboard"], eval_every=2, **TINY)
    acc = events(out / "tensorboard")
    rows = rows_of(out)
    tags = acc.Tags()
    assert {"accuracy/personalized", "accuracy/tail", "train/loss", "cost/bytes_up"} <= set(tags["scalars"])
    for tag, key in (("accuracy/personalized", "personalized_acc"), ("accuracy/personalized_p10", "personalized_acc_p10"),
                     ("train/loss", "train_loss"), ("accuracy/global", "global_acc")):  # fmt: skip
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [r["round"] for r in rows] == [2, 4]
        assert [v for _, v in got] == pytest.approx([r[key] for r in rows], rel=1e-6)
    assert {"clients/accuracy", "classes/accuracy"} <= set(tags["histograms"])
    assert acc.Histograms("clients/accuracy")[-1].histogram_value.num == len(rows[-1]["per_client_acc"])
    texts = {t for t in tags["tensors"]}
    assert any(t.startswith("config") for t in texts) and any(t.startswith("classes") for t in texts)
    # elsewhere, and from a run without a folder
    fedtail.run(algorithm="fedavg", out=None, log=[f"tensorboard:{tmp_path / 'tb'}"], **TINY)
    assert events(tmp_path / "tb").Scalars("accuracy/personalized")[-1].step == 4


@TENSORBOARD
def test_a_resumed_run_continues_one_log(tmp_path):
    config = tiny_config(rounds=5, checkpoint_every=2, log=["tensorboard"])
    out = tmp_path / "cut"

    class Stop(Exception):
        pass

    def stop(rnd, row):
        if rnd == 3:
            raise Stop

    with pytest.raises(Stop):
        run_to_folder(config, out, [OnRound(stop)])  # checkpoint after round 2, stopped after round 3
    run_to_folder(config, out, resume=None)
    rows = rows_of(out)
    got = [(e.step, e.value) for e in events(out / "tensorboard").Scalars("accuracy/personalized")]
    assert [s for s, _ in got] == [r["round"] for r in rows] == [1, 2, 3, 4, 5]  # round 3 once, from the resumed run
    assert [v for _, v in got] == pytest.approx([r["personalized_acc"] for r in rows], rel=1e-6)


def test_bad_log_settings_are_clear_errors_and_sweeps_ignore_the_setting(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown kind 'wandb'"):
        fedtail.run(algorithm="fedavg", out=None, log=["wandb"], **TINY)
    with pytest.raises(ConfigError, match="without an out folder needs --log tensorboard:DIR"):
        fedtail.run(algorithm="fedavg", out=None, log=["tensorboard"], **TINY)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were missing
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        fedtail.run(algorithm="fedavg", out=tmp_path / "x", log=["tensorboard"], **TINY)
    assert not (tmp_path / "x").exists()  # nothing written
    plain = tiny_config().model_dump(mode="json")
    assert "log" not in plain  # left out of config.json when unset
    assert config_diff(plain, tiny_config(log=["tensorboard"]).model_dump(mode="json")) == []


# --- MLflow -------------------------------------------------------------------------------------


def _mlflow_client(out):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(out / 'mlflow.db').resolve()}")


def test_mlflow_holds_params_metrics_and_artifacts_as_the_run_folder(tmp_path):
    out = tmp_path / "r"
    fedtail.run(algorithm="fedprox", out=out, log=["mlflow"], eval_every=2, set={"fedprox.mu": 0.1, **TINY["set"]},
                **{k: v for k, v in TINY.items() if k != "set"})  # fmt: skip
    client = _mlflow_client(out)
    (experiment,) = [e for e in client.search_experiments() if e.name == "fedtail"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.params["algorithm"] == "fedprox" and run.data.params["options.mu"] == "0.1"
    assert run.data.params["train.lr"] == "0.05"
    rows = rows_of(out)
    for tag, key in (("accuracy/personalized", "personalized_acc"), ("train/loss", "train_loss")):
        history = client.get_metric_history(run.info.run_id, tag)
        assert [m.step for m in history] == [r["round"] for r in rows] == [2, 4]
        assert [m.value for m in history] == pytest.approx([r[key] for r in rows], rel=1e-9)
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "config.json", "partition.json", "accuracy.png"} <= names
    assert (out / "mlflow_run_id").read_text().strip() == run.info.run_id


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    config = tiny_config(rounds=5, checkpoint_every=2, log=["mlflow"])
    out = tmp_path / "cut"

    class Stop(Exception):
        pass

    def stop(rnd, row):
        if rnd == 3:
            raise Stop

    with pytest.raises(Stop):
        run_to_folder(config, out, [OnRound(stop)])
    client = _mlflow_client(out)
    (first,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert first.info.status == "FAILED"
    run_to_folder(config, out, resume=None)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    last = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "accuracy/personalized")}
    rows = rows_of(out)
    assert sorted(last) == [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert [last[r["round"]] for r in rows] == pytest.approx([r["personalized_acc"] for r in rows], rel=1e-9)


def test_a_sweep_names_the_experiment_and_the_runs(tmp_path):
    pytest.importorskip("mlflow")
    from helpers import invoke, sweep_base

    path = tmp_path / "s.toml"
    body = f'out = "{(tmp_path / "runs").as_posix()}"\nseeds = [0]\n' + sweep_base(1)
    path.write_text(body + '[methods.fedavg]\nlog = ["mlflow"]\n')
    res = invoke("sweep", str(path))
    assert res.exit_code == 0, res.output
    run_dir = tmp_path / "runs" / "default" / "fedavg" / "seed0"
    client = _mlflow_client(run_dir)
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    assert experiment.name == str(path)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "default/fedavg/seed0"


def test_mlflow_missing_is_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="without an out folder needs --log mlflow:URI"):
        fedtail.run(algorithm="fedavg", out=None, log=["mlflow"], **TINY)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.entities", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ConfigError, match="pip install mlflow-skinny"):
        fedtail.run(algorithm="fedavg", out=tmp_path / "x", log=["mlflow"], **TINY)
    assert not (tmp_path / "x").exists()
