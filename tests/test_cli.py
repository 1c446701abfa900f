"""The command line: a tiny end-to-end run, config files, --set, and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import invoke

TINY = [
    "--dataset", "synthetic", "--model", "mlp", "--partition", "dirichlet", "--alpha", "0.5",
    "--clients", "6", "--fraction", "0.5", "--rounds", "2", "--local-epochs", "1",
    "--batch-size", "16", "--lr", "0.05", "--set", "dataset_options.train_per_class=60",
    "--set", "dataset_options.num_classes=5",
]  # fmt: skip


def test_run_end_to_end_writes_the_three_files(tmp_path):
    out = tmp_path / "run"
    res = invoke("run", "--algorithm", "fedavg", *TINY, "--imbalance", "5", "--out", str(out))
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["partition"]["imbalance"] == 5 and config["partition"]["num_clients"] == 6
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["round"] for l in lines] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("personalized_acc", "personalized_acc_weighted", "global_acc"):
        assert 0 <= summary["final"][key] <= 1
    assert summary["best"]["round"] in (1, 2) and 0 <= summary["best"]["personalized_acc"] <= 1
    assert summary["rounds"] == 2 and summary["samples_trained"] > 0 and summary["wall_time_s"] > 0
    # the machine of this run: wall times compare only between runs of the same CPU capability
    assert summary["machine"]["cores"] >= 1 and isinstance(summary["machine"]["cpu_capability"], str)
    # and the code that made it (a sweep may outlive several commits of the library)
    assert summary["code"]["fedtail"] and set(summary["code"]) == {"fedtail", "commit", "modified"}


def test_client_state_on_disk_gives_the_same_run_and_leaves_no_files(tmp_path):
    args = ("run", "--algorithm", "ditto", *TINY, "--checkpoint-every", "1")
    memory = invoke(*args, "--out", str(tmp_path / "memory"))
    disk = invoke(*args, "--client-state", "disk", "--out", str(tmp_path / "disk"))
    assert memory.exit_code == 0 and disk.exit_code == 0, disk.output
    assert json.loads((tmp_path / "disk" / "config.json").read_text())["client_state"] == "disk"
    assert "client_state" not in json.loads((tmp_path / "memory" / "config.json").read_text())  # the default
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "elapsed_s"}  # noqa: E731
    rows = [[strip(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("memory", "disk")]
    assert rows[0] == rows[1]
    assert not (tmp_path / "disk" / ".client-state").exists()


def test_local_summary_has_null_global(tmp_path):
    res = invoke("run", "--algorithm", "local", *TINY, "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["final"]["global_acc"] is None


def test_config_file_and_flag_override(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'algorithm = "fedavg"\ndataset = "synthetic"\nmodel = "mlp"\nrounds = 3\n'
        "[dataset_options]\nnum_classes = 4\ntrain_per_class = 40\n"
        '[partition]\nscheme = "iid"\nnum_clients = 4\n[train]\nlr = 0.1\n'
    )
    res = invoke("run", "--config", str(cfg), "--rounds", "1", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["rounds"] == 1 and config["train"]["lr"] == 0.1 and config["partition"]["scheme"] == "iid"


def test_finished_run_is_not_overwritten_silently(tmp_path):
    out = tmp_path / "r"
    assert invoke("run", "--algorithm", "fedavg", *TINY, "--out", str(out)).exit_code == 0
    res = invoke("run", "--algorithm", "fedavg", *TINY, "--out", str(out))
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert invoke("run", "--algorithm", "fedavg", *TINY, "--out", str(out), "--overwrite").exit_code == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--algorithm", "fedmagic"], "--algorithm"),
        (["--algorithm", "fedavg", "--model", "vgg99"], "--model"),
        (["--algorithm", "fedavg", "--dataset", "imagenet"], "--dataset"),
        (["--algorithm", "fedavg", "--alpha", "-1"], "--alpha"),
        (["--algorithm", "fedavg", "--fraction", "0"], "--fraction"),
        (["--algorithm", "fedavg", "--fraction", "1.5"], "--fraction"),
        (["--algorithm", "fedavg", "--imbalance", "0.5"], "--imbalance"),
        (["--algorithm", "fedavg", "--set", "nonsense"], "--set"),
        (["--algorithm", "fedavg", "--set", "fedavg.mu=1"], "mu"),
        (["--algorithm", "fedavg", "--set", "fedprox.mu=1"], "--set"),
        (["--algorithm", "fedavg", "--set", "bogus.key=1"], "--set"),
        (["--algorithm", "fedavg", "--partition", "zipf"], "partition"),
        (["--algorithm", "fedavg", "--quantity", "9:3"], "--quantity"),
        (["--algorithm", "fedavg", "--client-state", "cloud"], "--client-state"),
        # far more clients than samples: some client gets no data
        (["--algorithm", "fedavg", "--partition", "iid", "--clients", "5000"], "no training"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_run(tmp_path, args, needle):
    out = tmp_path / "run"
    base = [a for a in TINY if a not in ()]
    # later flags win in click, so the bad value goes last
    res = invoke("run", *base, *args, "--out", str(out))
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert needle in text, text
    assert "Traceback" not in text
    assert not (out / "summary.json").exists()


def test_missing_config_file(tmp_path):
    res = invoke("run", "--config", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "nope.toml" in res.output
    assert not (tmp_path / "r").exists()


def test_list_names_everything():
    res = invoke("list")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    kinds = {line.split()[0] for line in lines if not line.startswith(" ")}
    assert kinds == {"algorithm", "dataset", "model", "partition"}
    for name in ("fedavg", "local", "fmnist", "cnn-fmnist", "resnet8", "dirichlet", "dominant", "stages"):
        assert f" {name} " in res.output
    # under each algorithm its reference settings, tasks, robust rules and DP, under each model its head splits
    details = {line.split()[0] for line in lines if line.startswith(" ")}
    assert details == {"reference:", "tasks:", "robust:", "privacy:", "head"}
    tasks = [line.strip() for line in lines if line.strip().startswith("tasks:")]
    assert len(tasks) == len([line for line in lines if line.startswith("algorithm ")])
    assert "tasks: classification, segmentation" in tasks
    assert any(t.startswith("tasks: classification (not segmentation: ") for t in tasks)
    after = {lines[i - 1].split()[1]: line.strip() for i, line in enumerate(lines) if line.startswith(" ") and not lines[i - 1].startswith(" ")}
    assert after["fedbabu"] == "reference: PFLlib: head last, momentum 0, weight decay 0, grad clip none, finetune epochs=5"
    assert after["fedrema"].endswith("head all-fc, momentum 0.9, weight decay 0, grad clip 10")
    assert 'beta=null, steps="pfllib"' in after["perfedavg"]
    assert after["cnn2fc"] == "head splits: all-fc (own) = 2 FC, last = 1 FC"


def test_partition_command_writes_json_and_png(tmp_path):
    out = tmp_path / "p.json"
    res = invoke(
        "partition", "--dataset", "synthetic", "--partition", "dirichlet", "--alpha", "0.3",
        "--clients", "8", "--imbalance", "10", "--seed", "3", "--out", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert len(data["global_train_counts"]) == 10 and len(data["clients"]) == 8
    assert [sum(c["train_counts"][k] for c in data["clients"]) for k in range(10)] == data["global_train_counts"]
    assert all(len(c["test_counts"]) == 10 for c in data["clients"])
    assert data["global_train_counts"][0] == 500 and data["global_train_counts"][9] == 50  # IF = 10
    assert out.with_suffix(".png").stat().st_size > 1000


def test_dominant_groups_flag_sets_the_label_groups(tmp_path):
    """--groups reaches the partition: 2 groups of 6 labels each (synthetic data has 10 classes)."""
    out = tmp_path / "p.json"
    res = invoke(
        "partition", "--dataset", "synthetic", "--partition", "dominant", "--groups", "2",
        "--clients", "4", "--samples-per-client", "60", "--iid-fraction", "0", "--out", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    held = [{k for k, n in enumerate(c["train_counts"]) if n} for c in json.loads(out.read_text())["clients"]]
    assert held[0] <= {0, 1, 2, 3, 4, 5} and held[1] <= {5, 6, 7, 8, 9, 0} and held[0] == held[2]


def test_config_file_may_use_flag_names(tmp_path):
    cfg = tmp_path / "flat.toml"
    cfg.write_text(
        'algorithm = "local"\ndataset = "synthetic"\nmodel = "mlp"\npartition = "pathological"\n'
        'classes-per-client = 2\nclients = 5\nlocal-epochs = 2\nrounds = 1\nquantity = "20:40"\n'
        "[dataset_options]\nnum_classes = 4\n"
    )
    res = invoke("run", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["partition"]["scheme"] == "pathological" and config["partition"]["num_clients"] == 5
    assert config["partition"]["quantity"] == [20, 40] and config["train"]["local_epochs"] == 2


def test_the_cli_reference_is_current():
    """docs/cli.md is generated from the Typer app; regenerate with `make cli-doc` after a CLI change."""
    from fedtail.cli.reference import reference

    committed = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    assert committed == reference(), "docs/cli.md is stale: run `make cli-doc`"
    assert "| `--clients` | `20` |" in committed and "## `fedtail runs`" in committed


def test_a_setting_declared_on_its_field_gets_its_flag_help_and_config_json_rule():
    """One declaration (fedtail.settings): the flag, its help and panel, the flag map, the
    left-out-at-default rule of config.json and the sweep's ignore list all derive from it."""
    import typer
    from pydantic import Field
    from typer.testing import CliRunner

    from fedtail.cli.options import with_setting_options
    from fedtail.config import RunConfig
    from fedtail.settings import flag_keys, setting, settings

    class Extended(RunConfig):
        gizmo_count: int = Field(3, ge=1, json_schema_extra=setting(
            "gizmos per round", flag="gizmos", panel="Rounds and evaluation", omit_default=True, sweep_ignores=True))

    item = next(s for s in settings(Extended) if s.path == ("gizmo_count",))
    assert (item.flag, item.default, item.help, item.sweep_ignores) == ("--gizmos", 3, "gizmos per round", True)
    assert flag_keys(Extended)["gizmos"] == ("gizmo_count",) and "gizmos" not in flag_keys(RunConfig)
    assert flag_keys(Extended)["clients"] == ("partition", "num_clients")  # nested models are walked
    # config.json: left out at its default, written and read back otherwise
    assert "gizmo_count" not in Extended().model_dump(mode="json")
    stored = Extended(gizmo_count=5).model_dump(mode="json")
    assert stored["gizmo_count"] == 5 and Extended.model_validate(stored).gizmo_count == 5
    # the command line: the flag, its help in its panel, the value passed on
    app = typer.Typer()
    seen = {}

    @app.command()
    @with_setting_options("run", Extended)
    def go(*, out: str = typer.Option("x"), **given):
        seen.update(given)

    runner = CliRunner()
    shown = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "--gizmos" in shown.output and "gizmos per round" in shown.output and "Rounds and evaluation" in shown.output
    assert runner.invoke(app, ["--gizmos", "7", "--clients", "4"]).exit_code == 0
    assert seen["gizmos"] == 7 and seen["clients"] == 4 and seen["rounds"] is None


def test_version_is_the_one_version_string():
    import tomllib

    import fedtail

    res = invoke("--version")
    assert res.exit_code == 0 and res.output.strip() == f"fedtail {fedtail.__version__}"
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]  # read from fedtail.__version__
