"""fedtail from Python, plug-ins by import path and entry point, own data, and the examples."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import fedtail
from fedtail import components
from fedtail.engine import checkpoint, prepare
from fedtail.engine.callbacks import Checkpointer
from fedtail.engine.simulation import Simulation
from helpers import invoke, strip_timing

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = dict(dataset="synthetic", model="mlp", clients=6, rounds=2, fraction=0.5, batch_size=16, lr=0.05,
            set={"dataset_options.num_classes": 5})  # fmt: skip

PLUGIN = '''
from fedtail.api import Algorithm, ClientHalf, Message, ServerHalf, WeightedMean

class Server(ServerHalf):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.weights = dict(ctx.init_weights)
    def run_round(self, rnd, clients, comm):
        mean = WeightedMean()
        for _, reply in comm.stream({c: Message("fit", self.weights) for c in clients}):
            mean.add(reply.tensors, reply.metrics["num_examples"])
        self.weights = mean.result()
    def global_weights(self):
        return self.weights

class Client(ClientHalf):
    def fit(self, msg, ctx):
        ctx.load(msg.tensors)
        ctx.train()
        return ctx.reply(ctx.weights())

ALGO = Algorithm("plugged", "a plug-in FedAvg", Server, Client)
NOT_AN_ALGORITHM = 3
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module ``plugmod`` outside the package, importable here and in spawned workers and sweeps."""
    (tmp_path / "plugmod.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield "plugmod"
    sys.modules.pop("plugmod", None)
    fedtail.algorithms.base.Algorithm.registry.pop("plugged", None)


# --- the Python API -------------------------------------------------------------------------------


def test_run_in_memory_writes_nothing_and_matches_a_folder_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = fedtail.run(algorithm="fedavg", out=None, **TINY)
    assert list(tmp_path.iterdir()) == []
    assert result.summary["status"] == "finished" and result.dir is None
    assert [row["round"] for row in result.rows] == [1, 2] and result.config.rounds == 2
    on_disk = fedtail.run(algorithm="fedavg", out=tmp_path / "r", **TINY)
    loaded = fedtail.load_run(tmp_path / "r")
    assert on_disk.dir == tmp_path / "r" and loaded.config == result.config
    assert strip_timing(loaded.rows) == strip_timing(result.rows)
    assert loaded.summary["final"] == result.summary["final"]


def test_a_callback_sees_every_round_and_evaluation_in_memory_and_in_a_folder(tmp_path):
    class Seen(fedtail.Callback):
        def __init__(self):
            self.events = []

        def on_run_start(self, sim, first_round):
            self.events.append(("start", first_round))

        def on_evaluation(self, sim, row):
            self.events.append(("eval", row["round"]))

        def on_round_end(self, sim, rnd, row):
            self.events.append(("round", rnd, None if row is None else row["round"]))

        def on_run_end(self, sim, summary):
            self.events.append(("end", summary["status"]))

    expected = [("start", 0), ("round", 1, None), ("eval", 2), ("round", 2, 2), ("round", 3, None),
                ("eval", 4), ("round", 4, 4), ("end", "finished")]  # fmt: skip
    flags = TINY | {"rounds": 4, "eval_every": 2}
    seen = Seen()
    plain = fedtail.run(algorithm="fedavg", out=None, **flags)
    result = fedtail.run(algorithm="fedavg", out=None, callbacks=[seen], **flags)
    assert seen.events == expected
    assert strip_timing(result.rows) == strip_timing(plain.rows)  # observing changes nothing
    in_folder = Seen()
    fedtail.run(algorithm="fedavg", out=tmp_path / "r", callbacks=[in_folder], **flags)
    assert in_folder.events == expected
    with pytest.raises(fedtail.ConfigError, match="callbacks: .*list"):
        fedtail.run(algorithm="fedavg", out=None, callbacks=Seen(), **flags)
    with pytest.raises(fedtail.ConfigError, match="builtin_function_or_method is not a fedtail.Callback"):
        fedtail.run(algorithm="fedavg", out=None, callbacks=[print], **flags)


def test_errors_are_the_command_lines(tmp_path):
    with pytest.raises(fedtail.ConfigError) as err:
        fedtail.run(algorithm="nope", out=None, **TINY)
    cli = invoke("run", "-a", "nope", "--dataset", "synthetic", "--out", tmp_path / "x")
    assert cli.exit_code == 2 and str(err.value) in " ".join(cli.output.split())
    with pytest.raises(fedtail.ConfigError, match="unknown keyword.*algo"):
        fedtail.run(algo="fedavg", out=None)
    with pytest.raises(fedtail.DataError, match="no such file"):
        fedtail.run(dataset=f"npz:{tmp_path / 'missing.npz'}", model="mlp", out=None)
    with pytest.raises(fedtail.FedtailError, match="not a finished fedtail run folder"):
        fedtail.load_run(tmp_path)


def test_sweep_from_python_runs_what_is_missing(tmp_path):
    file = tmp_path / "s.toml"
    file.write_text(f'out = "{(tmp_path / "runs").as_posix()}"\nseeds = [0]\n' + (EXAMPLES / "compare.toml").read_text().split("seeds = [0, 1]\n", 1)[1].replace("[methods.mine]\nalgorithm = \"my_fedprox:ALGORITHM\"\noptions = { mu = 0.1 }\n", "").replace("rounds = 5", "rounds = 1"))  # noqa: E501
    status = fedtail.sweep(file, jobs=1)
    assert sorted(status.values()) == ["done", "done"]
    assert fedtail.sweep(file) == {k: "done" for k in status}  # nothing left to run


# --- plug-ins ---------------------------------------------------------------------------------------


def test_a_plugin_algorithm_runs_serial_parallel_resumed_and_in_a_sweep(plugin, tmp_path):
    name = f"{plugin}:ALGO"
    serial = fedtail.run(algorithm=name, out=None, **TINY)
    parallel = fedtail.run(algorithm=name, workers=2, out=None, **TINY)
    assert strip_timing(serial.rows) == strip_timing(parallel.rows)
    reference = fedtail.run(algorithm="fedavg", out=None, **TINY)  # the plug-in is FedAvg
    assert serial.summary["final"]["personalized_acc"] == pytest.approx(reference.summary["final"]["personalized_acc"])

    config = fedtail.config_from_flags(algorithm=name, checkpoint_every=1, **TINY)
    saved = []
    Simulation(config, *prepare(config), callbacks=[Checkpointer(lambda s: saved.append(checkpoint.to_bytes(s)))]).run()
    resumed = Simulation(config, *prepare(config))
    resumed.restore(checkpoint.load(saved[0]))
    resumed.run()
    assert strip_timing(resumed.record.rows) == strip_timing(serial.rows)

    file = tmp_path / "s.toml"
    file.write_text(f'out = "{(tmp_path / "runs").as_posix()}"\nseeds = [0]\n[base]\ndataset = "synthetic"\n'
                    'model = "mlp"\nrounds = 1\n[base.dataset_options]\nnum_classes = 5\n[base.partition]\n'
                    f'num_clients = 6\n[methods.mine]\nalgorithm = "{name}"\n')  # fmt: skip
    assert list(fedtail.sweep(file).values()) == ["done"]


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("algorithm", "no_such_module_xyz:ALGO", "cannot import module 'no_such_module_xyz'"),
        ("algorithm", "plugmod:MISSING", "has no attribute 'MISSING'"),
        ("algorithm", "plugmod:NOT_AN_ALGORITHM", "is a int, not a fedtail Algorithm"),
        ("model", "plugmod:NOT_AN_ALGORITHM", "not a function building a SplitModel"),
        ("model", "plugmod:ALGO", "not a function building a SplitModel"),
        ("dataset", "plugmod:NOT_AN_ALGORITHM", "not a loader function"),
        ("algorithm", "plugmod:", "an import path is MODULE:NAME"),
    ],
)
def test_an_import_path_that_does_not_hold_the_right_kind_is_a_clear_error(plugin, flag, value, message):
    with pytest.raises(fedtail.ConfigError, match=message.replace("(", r"\(")):
        fedtail.run(out=None, **(TINY | {flag: value}))


def test_a_model_and_a_dataset_by_import_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    cnn = fedtail.run(model="my_model:tiny_cnn", dataset="digits", clients=4, rounds=1, out=None)
    assert cnn.summary["status"] == "finished"
    # tiny_cnn's weights went down: conv 16·(9+1) + 256·32+32 + head 32·10+10 = 8714 float32, one client a round
    assert cnn.summary["bytes"]["down"] == 4 * 8714 * cnn.config.clients_per_round
    blobs = fedtail.run(dataset="my_data:blobs", model="mlp", clients=4, rounds=1, out=None,
                        set={"dataset_options.num_classes": 4})  # fmt: skip
    assert blobs.summary["status"] == "finished" and len(blobs.summary["final"]) > 0
    assert blobs.partition["num_classes"] == 4 and blobs.partition["num_kept"] == 320  # 80 % of 4 x 100 blobs


def test_entry_points_register_names_that_fedtail_list_shows(plugin, tmp_path, monkeypatch):
    dist = tmp_path / "fedtail_plug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fedtail-plug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fedtail.algorithms]\nplugged = plugmod:ALGO\n")
    components._entry_points.cache_clear()
    try:
        listing = invoke("list")
        assert "plugged" in listing.output and "plugmod:ALGO" in listing.output
        assert fedtail.run(algorithm="plugged", out=None, **TINY).summary["status"] == "finished"
    finally:
        components._entry_points.cache_clear()


# --- own data -----------------------------------------------------------------------------------------


def write_npz(path: Path, **arrays) -> str:
    np.savez(path, **arrays)
    return f"npz:{path}"


def clustered_arrays(clients: int = 3, per_client: int = 60, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=clients * per_client)
    x = rng.normal(size=(len(y), 6)).astype(np.float32) + y[:, None]
    return {"x": x, "y": y * 10, "client": np.repeat(np.arange(clients) + 100, per_client)}  # labels and ids remapped


def test_an_npz_with_client_ids_keeps_its_clients(tmp_path):
    arrays = clustered_arrays()
    spec = write_npz(tmp_path / "d.npz", **arrays)
    result = fedtail.run(dataset=spec, model="mlp", partition="natural", clients=3, rounds=1, out=tmp_path / "r")
    clients = result.partition["clients"]
    data, _ = prepare(result.config)
    assert data.num_classes == 4 and data.class_names == ("0", "10", "20", "30")
    for cid, client in enumerate(clients):  # each client's rows: its own, train and the 20 % test carve together
        own = (arrays["client"] == 100 + cid)
        total = sum(client["train_counts"]) + int((data.test.clients.numpy() == cid).sum())
        assert total == own.sum()
    cut = fedtail.run(dataset=spec, model="mlp", partition="natural", clients=3, imbalance=10, rounds=1, out=None)
    assert sum(sum(c["train_counts"]) for c in cut.partition["clients"]) < sum(sum(c["train_counts"]) for c in clients)
    own_test = fedtail.run(dataset=spec, model="mlp", partition="natural", clients=3, local_test="own", rounds=1, out=None)
    assert [sum(c["test_counts"]) for c in own_test.partition["clients"]] == [
        int((data.test.clients.numpy() == cid).sum()) for cid in range(3)
    ]
    with pytest.raises(fedtail.ConfigError, match="the data has 3 clients; pass --clients 3"):
        fedtail.run(dataset=spec, model="mlp", partition="natural", clients=5, rounds=1, out=None)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((4, 3))}, "no array 'y'"),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4)}, "'y' must be a 1-D integer array"),
        ({"x": np.zeros((5, 3)), "y": np.zeros(4, int)}, "'x' must be N×C×H×W or N×D with N = len(y) = 4"),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4, int), "client": np.zeros(3, int)}, "'client' must be N = 4"),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4, int), "split": np.array(["a"] * 4)}, "'train' or 'test'"),
        ({"x": np.full((4, 3), np.nan), "y": np.zeros(4, int)}, "'x' holds NaN"),
    ],
)
def test_a_bad_npz_names_the_field(tmp_path, arrays, message):
    spec = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(fedtail.DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fedtail.run(dataset=spec, model="mlp", rounds=1, out=None)


def test_natural_takes_the_client_count_from_the_data(tmp_path):
    spec = write_npz(tmp_path / "d.npz", **clustered_arrays(clients=5, per_client=20))
    result = fedtail.run(dataset=spec, model="mlp", partition="natural", rounds=1, out=None)
    assert result.config.partition.num_clients == 5 and len(result.partition["clients"]) == 5
    with pytest.raises(fedtail.ConfigError, match="the data has 5 clients; pass --clients 5 \\(got 4\\)"):
        fedtail.run(dataset=spec, model="mlp", partition="natural", clients=4, rounds=1, out=None)


def test_natural_needs_client_ids(tmp_path):
    spec = write_npz(tmp_path / "d.npz", x=np.zeros((40, 3), np.float32), y=np.arange(40) % 2)
    for clients in ({"clients": 2}, {}):
        with pytest.raises(fedtail.ConfigError, match="--partition natural needs data with client ids"):
            fedtail.run(dataset=spec, model="mlp", partition="natural", rounds=1, out=None, **clients)


def test_a_folder_of_client_and_class_folders(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for client in ("site-a", "site-b"):
        for label in ("cat", "dog"):
            folder = tmp_path / "imgs" / client / label
            folder.mkdir(parents=True)
            for i in range(10):
                value = 200 if label == "dog" else 40
                pixels = np.clip(rng.normal(value, 20, size=(8, 8)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels, mode="L").save(folder / f"{i}.png")
    result = fedtail.run(dataset=f"folder:{tmp_path / 'imgs'}", model="mlp", partition="natural", clients=2,
                         rounds=3, local_epochs=5, batch_size=4, lr=0.05, out=None)  # fmt: skip
    data, _ = prepare(result.config)
    assert data.input_shape == (1, 8, 8) and data.class_names == ("cat", "dog")
    assert [sum(c["train_counts"]) for c in result.partition["clients"]] == [16, 16]
    assert result.summary["final"]["personalized_acc"] > 0.5


# --- the examples ------------------------------------------------------------------------------------


def test_the_examples_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    res = invoke("run", "--algorithm", "my_fedprox:ALGORITHM", "--dataset", "synthetic", "--model", "mlp",
                 "--rounds", "2", "--clients", "6", "--set", "algo.mu=0.1", "--set", "dataset_options.num_classes=5",
                 "--out", tmp_path / "mine")  # fmt: skip
    assert res.exit_code == 0, res.output
    import my_data

    my_data.write_example(str(tmp_path / "h.npz"))
    res = invoke("run", "--dataset", f"npz:{tmp_path / 'h.npz'}", "--model", "mlp", "--partition", "natural",
                 "--clients", "4", "--local-test", "own", "--rounds", "2", "--out", tmp_path / "nat")  # fmt: skip
    assert res.exit_code == 0, res.output
    toml = (EXAMPLES / "compare.toml").read_text().replace("rounds = 5", "rounds = 1")
    (tmp_path / "compare.toml").write_text(toml.replace('out = "runs/examples/compare"', f'out = "{(tmp_path / "cmp").as_posix()}"'))
    res = invoke("sweep", tmp_path / "compare.toml", "--jobs", "1")
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "cmp").rglob("summary.json"))) == 6


@pytest.mark.parametrize("algorithm", ["fedrep", "fedper", "fedbabu"])
def test_a_plugin_model_runs_methods_whose_reference_moves_the_head(algorithm, monkeypatch):
    # Their reference code splits at the last linear layer (--head last) on built-in models; a
    # plug-in model keeps its own split, the only one it has, and the run says so (head null).
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = fedtail.run(algorithm=algorithm, model="my_model:tiny_cnn", dataset="digits", clients=4, rounds=1,
                         fraction=0.5, batch_size=16, out=None)  # fmt: skip
    assert result.config.head is None
    assert 0.0 <= result.summary["final"]["personalized_acc"] <= 1.0
    from fedtail.components import apply_reference

    for model, head in (("cnn2fc", "last"), (None, "last"), ("my_model:tiny_cnn", None)):
        raw = {"algorithm": algorithm} | ({"model": model} if model else {})
        apply_reference(raw)  # the reference split still applies to built-in models (default: cnn-fmnist)
        assert raw.get("head") == head, model
    with pytest.raises(fedtail.errors.ConfigError, match="plug-in"):  # asked for explicitly: a clear error
        fedtail.run(algorithm=algorithm, model="my_model:tiny_cnn", dataset="digits", head="last", out=None)


def test_runs_as_a_dataframe_and_from_the_command_line(tmp_path):
    pd = pytest.importorskip("pandas")
    root = tmp_path / "runs"
    for seed in (0, 1):
        fedtail.run(algorithm="fedavg", out=root / "s" / "fedavg" / f"seed{seed}", seed=seed, **TINY)
    fedtail.run(algorithm="local", out=root / "s" / "local" / "seed0", **TINY)
    (root / "broken" / "seed0").mkdir(parents=True)
    (root / "broken" / "seed0" / "summary.json").write_text("{")
    with pytest.warns(UserWarning, match="broken.*left out"):
        frame = fedtail.load_runs(root)
    assert isinstance(frame, pd.DataFrame) and len(frame) == 3
    assert list(frame["method"]) == ["fedavg", "fedavg", "local"] and set(frame["setting"]) == {"s"}
    one = fedtail.load_run(root / "s" / "fedavg" / "seed1")
    row = frame[frame["path"] == "s/fedavg/seed1"].iloc[0]
    assert row["final.personalized_acc"] == pytest.approx(one.summary["final"]["personalized_acc"])
    assert row["config.seed"] == 1 and row["config.partition.num_clients"] == 6 and row["status"] == "finished"
    assert row["code.commit"] == one.summary["code"]["commit"] or pd.isna(row["code.commit"])
    evals = one.frame()
    assert list(evals["round"]) == [r["round"] for r in one.rows]
    assert evals["personalized_acc"].tolist() == pytest.approx([r["personalized_acc"] for r in one.rows])
    res = invoke("runs", str(root), "--csv", str(tmp_path / "t.csv"))
    assert res.exit_code == 0, res.output
    assert "3 run(s)" in res.output and "wrote" in res.output
    assert pd.read_csv(tmp_path / "t.csv")["config.algorithm"].tolist() == ["fedavg", "fedavg", "local"]
    assert invoke("runs", str(tmp_path / "nowhere")).exit_code == 2
