"""The Flower adapter without a network: the ServerApp's code on an in-process grid of real ClientApps.

Every message goes through Flower's serialisation and the real ``client_app``, each node with its
own node config and state folder, so these tests show what a deployment computes; the loopback
deployments (real SuperLink and SuperNodes, TLS, node keys, a killed node) are in
``tests/deployment`` (``make test-flower``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import flwr  # noqa: E402,F401  (no skip: `make test` installs Flower, and CI must run these)

from fedtail.config import RunConfig  # noqa: E402
from fedtail.engine import prepare  # noqa: E402
from fedtail.engine.callbacks import OnRound, Rows  # noqa: E402
from fedtail.engine.executors import ClientRuntime, SerialExecutor  # noqa: E402
from fedtail.engine.simulation import Simulation  # noqa: E402
from fedtail.flower import FlowerError  # noqa: E402
from fedtail.flower.inprocess import InProcessGrid  # noqa: E402
from fedtail.flower.node import NodeSettings, StateStore, parse_clients  # noqa: E402
from fedtail.flower.server import GridExecutor, GridSettings, serve  # noqa: E402
from fedtail.report.runfiles import metrics_line  # noqa: E402
from fedtail.runner import run_to_folder  # noqa: E402
from grids import DyingGrid  # noqa: E402
from helpers import algorithm_config, invoke, run_with_summary, strip_timing  # noqa: E402

# the algorithms: FedAvg, Ditto, FedRep, MuPFL with its edge tier, FedAC, FedReMa, GLDP (stage tasks)
ALGORITHMS = ["fedavg", "ditto", "fedrep", "mupfl", "fedac", "fedrema", "gldp"]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def as_json(rows: list[dict]) -> list[dict]:
    """Rows as metrics.jsonl holds them (NaN as null): what a run folder compares against."""
    return [json.loads(metrics_line(row)) for row in rows]


def nodes(tmp_path: Path, *configs: dict) -> dict[int, dict]:
    """Node id -> node config, each node with its own state folder."""
    return {100 + k: {"state-dir": str(tmp_path / f"node{k}")} | c for k, c in enumerate(configs)}


def run_config(config: RunConfig, out: Path, round_timeout: float = 0.0) -> dict:
    return {"config": config.model_dump_json(), "out": str(out), "round-timeout": round_timeout, "node-wait": 2.0}


# --- the same results as the simulator ------------------------------------------------------------------


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_gives_the_simulators_results_bit_for_bit(tmp_path, name):
    """Same metrics rows (every evaluation, round logs, byte counts), only the timings differ.

    Nodes are configured both ways (client lists and partition-id / num-partitions) and host
    unequal numbers of clients; the client state lives in the nodes' folders, never on the server.
    """
    config = algorithm_config(name, checkpoint_every=0)
    summary, rows, sim = run_with_summary(config)
    assert config.partition.num_clients == 6
    grid = InProcessGrid(
        nodes(tmp_path, {"clients": "0,2"}, {"partition-id": 1, "num-partitions": 2}, {"clients": "4"}),
        rc := run_config(config, tmp_path / "run"),
    )
    flower_summary = serve(grid, rc)
    assert strip_timing(rows_of(tmp_path / "run")) == as_json(strip_timing(rows))
    for key in ("final", "best", "samples_trained", "rounds_to_accuracy"):
        assert flower_summary[key] == json.loads(json.dumps(summary[key])), key
    # the payload counts are the simulator's; the wire bytes are Flower's serialised messages (with
    # evaluation and hello, and one copy of an array that several clients of a node receive)
    assert {k: flower_summary["bytes"][k] for k in ("down", "up", "edge_up")} == summary["bytes"]
    assert flower_summary["bytes"]["wire_down"] > 0 and flower_summary["bytes"]["wire_up"] > summary["bytes"]["up"]
    # one message per node and exchange, tasks of its clients only
    assert {node for node, _ in grid.delivered} == set(grid.node_configs)
    stored = {c for node in tmp_path.glob("node*") for c in StateStore(node, 1)}
    assert stored == set(sim.client_state)  # every client state the simulator keeps is on a node, none on the server


@pytest.mark.parametrize("name", ["ditto", "fedac"])
def test_a_serverapp_that_died_resumes_from_its_checkpoint_with_the_simulators_results(tmp_path, name):
    """Checkpoint after round 2, the host dies in round 4 (nodes hold accepted and pending states of
    rounds 3-4), a new Flower run resumes: the nodes go back to round 2, the results are unstopped ones."""
    config = algorithm_config(name, rounds=5, checkpoint_every=2, eval_every=2)
    summary, rows, _ = run_with_summary(config)
    where = nodes(tmp_path, {"clients": "0-2"}, {"clients": "3-5"})
    rc = run_config(config, tmp_path / "run")
    with pytest.raises(RuntimeError, match="died"):
        serve(DyingGrid(where, rc, run_id=7, die_in=4), rc, run_id=7)
    assert (tmp_path / "run" / "checkpoint.pt").exists() and not (tmp_path / "run" / "summary.json").exists()
    assert any((tmp_path / "node0" / "run-7").glob("client-*.r*.pt"))  # states of rounds after the checkpoint are kept apart
    resumed = serve(InProcessGrid(where, rc | {"resume": True}, run_id=8), rc | {"resume": True}, run_id=8)
    assert strip_timing(rows_of(tmp_path / "run")) == as_json(strip_timing(rows))
    assert resumed["final"] == json.loads(json.dumps(summary["final"]))
    assert not (tmp_path / "node0" / "run-8").exists()  # the first run's state folder serves the resumed run
    assert [p["from_round"] for p in resumed["pieces"]] == [1, 3]


def test_a_run_that_dies_twice_resumes_twice_to_the_simulators_results(tmp_path):
    """Dies in round 4 (checkpoint 2), resumes and dies in round 6 (checkpoint 4, written by the resumed
    run), resumes again, with --checkpoint-every 0 the second time (no checkpoint after it is needed)."""
    config = algorithm_config("ditto", rounds=7, checkpoint_every=2, eval_every=2)
    summary, rows, _ = run_with_summary(config)
    where = nodes(tmp_path, {"clients": "0-2"}, {"clients": "3-5"})
    rc = run_config(config, tmp_path / "run")
    with pytest.raises(RuntimeError, match="died"):
        serve(DyingGrid(where, rc, run_id=1, die_in=4), rc, run_id=1)
    with pytest.raises(RuntimeError, match="died"):
        serve(DyingGrid(where, rc | {"resume": True}, run_id=2, die_in=6), rc | {"resume": True}, run_id=2)
    assert json.loads((tmp_path / "run" / "checkpoint.json").read_text())["round"] == 4
    last = run_config(config.model_copy(update={"checkpoint_every": 0}), tmp_path / "run") | {"resume": True}
    resumed = serve(InProcessGrid(where, last, run_id=3), last, run_id=3)
    assert strip_timing(rows_of(tmp_path / "run")) == as_json(strip_timing(rows))
    assert resumed["final"] == json.loads(json.dumps(summary["final"]))
    assert [p["from_round"] for p in resumed["pieces"]] == [1, 3, 5]


def test_a_flower_checkpoint_is_not_resumed_by_the_simulator_nor_a_simulator_one_by_flower(tmp_path):
    from fedtail.engine import checkpoint
    from fedtail.engine.callbacks import Checkpointer

    config = algorithm_config("fedavg", rounds=4, checkpoint_every=2)
    saved: list[dict] = []
    sim = Simulation(config, *prepare(config), callbacks=[Checkpointer(saved.append)])
    sim.run()
    grid_sim = Simulation(config, *prepare(config), executor_factory=lambda s: GridExecutor(
        s, InProcessGrid(nodes(tmp_path, {"clients": "0-5"}), run_config(config, tmp_path / "r")), GridSettings(node_wait=2.0)))
    with pytest.raises(checkpoint.CheckpointError, match="simulator run"):
        grid_sim.restore(checkpoint.load(checkpoint.to_bytes(saved[0])))
    flower_state = saved[0] | {"executor": {"state_run": 1, "to_confirm": [], "sent_tag": [], "accepted": []}}
    with pytest.raises(checkpoint.CheckpointError, match="Flower run"):
        Simulation(config, *prepare(config)).restore(flower_state)


def test_one_node_per_client_gives_the_same_results(tmp_path):
    config = algorithm_config("ditto", checkpoint_every=0, rounds=2)
    _, rows, _ = run_with_summary(config)
    n = config.partition.num_clients
    grid = InProcessGrid(nodes(tmp_path, *({"clients": str(c)} for c in range(n))), rc := run_config(config, tmp_path / "r"))
    serve(grid, rc)
    assert strip_timing(rows_of(tmp_path / "r")) == as_json(strip_timing(rows))


def test_rejected_replies_leave_the_node_state_as_the_simulator_leaves_it(tmp_path):
    """A rejected reply's state is dropped in the simulator; the node drops its pending state likewise."""
    config = algorithm_config("ditto", checkpoint_every=0, fraction=1.0, faults={"max_update_norm": 0.2})
    _, rows, _ = run_with_summary(config)
    rejected = sum(log["rejected"] for row in rows for log in row["rounds_log"])
    accepted = sum(log["replied"] - log["rejected"] for row in rows for log in row["rounds_log"])
    assert rejected > 0 and accepted > 0  # both paths are taken
    grid = InProcessGrid(nodes(tmp_path, {"clients": "0-2"}, {"clients": "3-5"}), rc := run_config(config, tmp_path / "r"))
    serve(grid, rc)
    assert strip_timing(rows_of(tmp_path / "r")) == as_json(strip_timing(rows))


# --- faults ---------------------------------------------------------------------------------------------------


class LateNodes(InProcessGrid):
    """Nodes in ``late`` run their tasks (their pending state is written) but their answers never arrive."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.late: set[int] = set()

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, message in zip(ids, messages):
            if message.metadata.dst_node_id in self.late:
                self.replies.pop(mid, None)
        return ids


class LosingExecutor(SerialExecutor):
    """The simulator's executor, losing the results of ``lost`` clients in round ``rnd`` (the reference)."""

    def __init__(self, sim: Simulation, rnd: int, lost: set[int]) -> None:
        super().__init__(ClientRuntime(sim.config, sim.dataset, sim.partition))
        self.rnd, self.lost = rnd, lost

    def map(self, tasks):
        for result in super().map(tasks):
            if not (tasks[0].rnd == self.rnd and result.cid in self.lost):
                yield result


@pytest.mark.parametrize("min_replies", [1, 6])
def test_a_node_lost_in_a_round_is_missing_and_rejoins_with_its_state(tmp_path, min_replies):
    """Node B answers nothing in round 2 (it ran its tasks, the answers are lost: timeout), then is replaced
    by a new SuperNode (another node id) with B's config and state folder.

    The run equals the simulator's with B's clients' results lost in round 2, bit for bit: the
    round goes on with the other replies (min_replies 1) or is skipped (6 of 6 needed); B's
    clients keep their round-1 state (the unconfirmed pending state of round 2 is discarded)
    and train from it in round 3.
    """
    config = algorithm_config("ditto", checkpoint_every=0, rounds=3, fraction=1.0, faults={"min_replies": min_replies})
    b_clients = {1, 3, 5}
    reference_rows: list[dict] = []
    dataset, partition = prepare(config)
    reference = Simulation(config, dataset, partition, callbacks=[Rows(reference_rows)],
                           executor_factory=lambda sim: LosingExecutor(sim, 2, b_clients))  # fmt: skip
    reference.run()

    node_configs = nodes(tmp_path, {"partition-id": 0, "num-partitions": 2}, {"partition-id": 1, "num-partitions": 2})
    grid = LateNodes(node_configs, rc := run_config(config, tmp_path / "r", round_timeout=0.5))

    def on_round(rnd, row):
        if rnd == 1:
            grid.late = {101}
        if rnd == 2:  # B's machine is back: a new SuperNode with B's node config
            grid.offline.add(101)
            grid.node_configs[201] = node_configs[101]
            grid.late = set()

    settings = GridSettings(round_timeout=0.5, node_wait=2.0)
    run_to_folder(config, tmp_path / "r", [OnRound(on_round)],
                  executor_factory=lambda sim: GridExecutor(sim, grid, settings), checkpoints=False)  # fmt: skip
    rows = rows_of(tmp_path / "r")
    assert strip_timing(rows) == as_json(strip_timing(reference_rows))
    round2 = rows[1]["rounds_log"][0]
    assert round2["missing"] == sorted(b_clients)
    assert ("skipped" in round2) == (min_replies == 6)
    assert rows[1]["eval_missing"] == sorted(b_clients)
    assert rows[2]["rounds_log"][0]["replied"] == 6  # B's clients are back in round 3
    assert (201, "train.tasks") in grid.delivered
    store = StateStore(tmp_path / "node1", 1)
    assert store.load(1)  # the state B's client kept on disk
    assert not (store.dir / "client-1.pending.pt").exists() or min_replies == 6


def test_a_node_that_goes_offline_is_not_waited_for(tmp_path):
    config = algorithm_config("fedavg", checkpoint_every=0, rounds=2, fraction=1.0)
    node_configs = nodes(tmp_path, {"clients": "0-2"}, {"clients": "3-5"})
    grid = InProcessGrid(node_configs, run_config(config, tmp_path / "r"))
    grid_settings = GridSettings(round_timeout=None, node_wait=2.0)  # no timeout: offline nodes are skipped

    def on_round(rnd, row):
        grid.offline.add(101)

    run_to_folder(config, tmp_path / "r", [OnRound(on_round)],
                  executor_factory=lambda sim: GridExecutor(sim, grid, grid_settings), checkpoints=False)  # fmt: skip
    rows = rows_of(tmp_path / "r")
    assert rows[1]["rounds_log"][0]["missing"] == [3, 4, 5]
    assert rows[1]["eval_missing"] == [3, 4, 5]


# --- nodes and their configuration ----------------------------------------------------------------------------


def test_clients_nobody_hosts_stop_the_start_with_their_ids(tmp_path):
    config = algorithm_config("fedavg", checkpoint_every=0)
    grid = InProcessGrid(nodes(tmp_path, {"clients": "0-3"}), rc := run_config(config, tmp_path / "r"))
    with pytest.raises(FlowerError, match=r"clients 4-5 are hosted by no SuperNode"):
        serve(grid, rc)
    assert "FlowerError" in (tmp_path / "r" / "FAILED").read_text()


def test_a_node_with_other_data_is_refused(tmp_path):
    config = algorithm_config("fedavg", checkpoint_every=0)
    other = config.model_copy(update={"seed": 1})  # another seed cuts another partition
    rc = run_config(config, tmp_path / "r")
    grid = InProcessGrid(nodes(tmp_path, {"clients": "0-5"}), rc | {"config": other.model_dump_json()})
    with pytest.raises(FlowerError, match="other data than the server's partition"):
        serve(grid, rc)


def test_node_config_is_parsed_and_checked():
    assert parse_clients("0,3, 5-7") == [0, 3, 5, 6, 7]
    with pytest.raises(FlowerError, match="clients="):
        parse_clients("3-1")
    assert NodeSettings.from_node_config({"partition-id": 1, "num-partitions": 3}).hosted(8) == [1, 4, 7]
    with pytest.raises(FlowerError, match="hosts no client"):
        NodeSettings.from_node_config({})
    with pytest.raises(FlowerError, match="partition-id < num-partitions"):
        NodeSettings.from_node_config({"partition-id": 3, "num-partitions": 3})
    with pytest.raises(FlowerError, match="do not exist"):
        NodeSettings.from_node_config({"clients": "0-9"}).hosted(6)


def test_a_node_keeps_the_states_a_resume_needs_and_goes_back_once_per_resume(tmp_path):
    store = StateStore(tmp_path, 1)
    for rnd in (1, 3, 4, 6):  # client 0 trained and accepted in rounds 1, 3, 4 and 6
        store.hold(0, {"r": rnd}, (rnd, 0))
        assert store.accept(0, (rnd, 0))
    store.hold(0, {"r": 7}, (7, 0))  # pending: its reply not confirmed yet
    store.hold(1, {"r": 5}, (5, 0))
    store.accept(1, (5, 0))
    assert list(store) == [0, 1] and store.load(0) == {"r": 6}
    store.prune(4)  # a checkpoint of round 4: round 4's state and the later ones stay
    assert sorted(p.name for p in store.dir.glob("client-0*")) == ["client-0.pending.pt", "client-0.pt", "client-0.r4-0.pt"]
    assert {p.stat().st_mode & 0o777 for p in store.dir.glob("client-*")} == {0o600}  # owner only
    assert store.restore({0: (4, 0), 1: None}, "token-a")  # the checkpoint's accepted tags; client 1 had none
    assert store.load(0) == {"r": 4} and 1 not in store
    assert not list(store.dir.glob("*.pending.pt")) and not list(store.dir.glob("client-*.r*.pt"))
    store.hold(0, {"r": 5}, (5, 0))
    store.accept(0, (5, 0))
    assert not store.restore({0: (4, 0)}, "token-a") and store.load(0) == {"r": 5}  # the same resume again: nothing
    store.hold(1, {"r": 6}, (6, 1))  # accepted in the checkpoint's round, not yet confirmed at the checkpoint
    assert store.restore({0: (5, 0), 1: (6, 1)}, "token-b") and store.load(1) == {"r": 6} and store.load(0) == {"r": 5}
    with pytest.raises(FlowerError, match="client 0: its state of round 3"):
        store.restore({0: (3, 0)}, "token-c")  # a version the node no longer has: an error, not a fresh start


def test_pending_state_becomes_the_state_only_when_confirmed(tmp_path):
    import torch

    store = StateStore(tmp_path, 7)
    assert store.load(0) == {} and 0 not in store and list(store) == []
    store.hold(0, {"w": torch.ones(2)}, (1, 0))
    assert store.load(0) == {} and len(store) == 0  # not accepted yet
    assert not store.accept(0, (1, 1))  # another call's tag
    assert store.accept(0, (1, 0)) and store.accept(0, (1, 0))  # confirming twice is harmless
    assert torch.equal(store.load(0)["w"], torch.ones(2)) and list(store) == [0]
    store.hold(0, {"w": torch.zeros(2)}, (2, 0))
    store.drop(0)
    assert torch.equal(store.load(0)["w"], torch.ones(2))
    assert not store.accept(0, (2, 0))  # dropped: nothing to accept
    store[3] = {"w": torch.zeros(1)}
    assert list(store) == [0, 3] and 3 in store
    del store[3]
    assert list(store) == [0]


# --- certificates, keys, the command line ------------------------------------------------------------------------


def test_certificates_chain_to_the_ca_and_node_keys_are_what_flower_reads(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    from fedtail.flower.deploy import make_node_key, make_tls

    files = make_tls(tmp_path, ["127.0.0.1", "superlink.example"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "superlink.example" in names.get_values_for_type(x509.DNSName)
    private, public = make_node_key(tmp_path, "node")
    assert isinstance(load_ssh_private_key(private.read_bytes(), None), ec.EllipticCurvePrivateKey)
    assert isinstance(load_ssh_public_key(public.read_bytes()), ec.EllipticCurvePublicKey)
    assert oct(private.stat().st_mode & 0o777) == "0o600"


def test_flower_local_takes_every_run_flag_and_checks_them_before_starting(tmp_path):
    run_help = invoke("run", "--help").output
    local_help = invoke("flower", "local", "--help").output
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", run_help))
    assert len(flags) > 40 and flags <= set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", local_help))
    assert {"--resume", "--aggregate", "--byzantine", "--dp-clip"} <= flags
    result = invoke("flower", "local", "--nodes", "9", "--dataset", "synthetic", "--model", "mlp", "--clients", "6",
                    "--out", tmp_path / "r")  # fmt: skip
    assert result.exit_code == 2 and "--nodes 9 exceeds the 6 clients" in result.output
    assert not (tmp_path / "r" / "flower").exists()  # nothing was started
    refused = invoke("flower", "local", "--nodes", "2", "--dataset", "synthetic", "--model", "mlp", "--clients", "6",
                     "-a", "ifca", "--aggregate", "median", "--out", tmp_path / "r")  # fmt: skip
    assert refused.exit_code == 2 and "ifca cannot take a robust rule" in refused.output
    assert not (tmp_path / "r" / "flower").exists()
    no_checkpoint = invoke("flower", "local", "--nodes", "2", "--resume", "--out", tmp_path / "empty")
    assert no_checkpoint.exit_code == 2 and "holds no run" in no_checkpoint.output


def test_a_plugin_algorithm_runs_on_flower_as_in_the_simulator(tmp_path, monkeypatch):
    """An algorithm by import path (examples/my_fedprox.py on the path): the nodes resolve it too."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    from fedtail.components import build_config
    from conftest import tiny_raw

    config = build_config(tiny_raw(algorithm="my_fedprox:ALGORITHM", rounds=2, options={"mu": 0.1}))
    summary, rows, _ = run_with_summary(config)
    grid = InProcessGrid(nodes(tmp_path, {"clients": "0-2"}, {"clients": "3-5"}), rc := run_config(config, tmp_path / "run"))
    flower_summary = serve(grid, rc)
    assert strip_timing(rows_of(tmp_path / "run")) == as_json(strip_timing(rows))
    assert flower_summary["final"] == json.loads(json.dumps(summary["final"]))
