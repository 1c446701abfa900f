"""Loopback Flower deployments: a real SuperLink and SuperNodes on 127.0.0.1 (``make test-flower``).

Each test starts its own processes on free ports, bounds every wait, and checks that none of
them is left running. Flower polls (a few seconds per exchange), so the runs are tiny.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtail.engine import prepare
from fedtail.engine.executors import ClientRuntime, SerialExecutor
from fedtail.engine.simulation import Simulation
from fedtail.flower.deploy import LocalDeployment, Node, free_port, make_node_key
from helpers import SMOKE, algorithm_config

RUN_TIMEOUT = 900  # seconds: a hung deployment fails the test instead of blocking CI


def flower_processes_under(folder: Path) -> list[str]:
    """Command lines of live processes that mention ``folder`` (what a deployment there started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder) in cmdline and state != "Z" and int(pid) != os.getpid():
            found.append(cmdline)
    return found


def test_flower_local_with_tls_and_auth_gives_the_simulators_results(tmp_path):
    """`fedtail flower local --nodes 3 --tls --auth` (the command line, as a user runs it) writes the run
    folder of `fedtail run`: the same rows and final metrics, bit for bit; then nothing is left running."""
    flags = [*SMOKE, "--algorithm", "fedavg", "--eval-every", "2"]
    out = tmp_path / "flower"
    result = subprocess.run(
        [sys.executable, "-m", "fedtail.cli.main", "flower", "local", "--nodes", "3", "--tls", "--auth", *flags,
         "--out", str(out)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    sim_out = tmp_path / "sim"
    sim = subprocess.run([sys.executable, "-m", "fedtail.cli.main", "run", *flags, "--out", str(sim_out)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    for name in ("config.json", "partition.json"):
        assert json.loads((out / name).read_text()) == json.loads((sim_out / name).read_text())
    flower, simulated = (json.loads((d / "summary.json").read_text()) for d in (out, sim_out))
    assert flower["final"] == simulated["final"]  # bit for bit (JSON keeps every digit of a float)
    assert flower["final"]["personalized_acc"] > 0.3
    strip = lambda d: [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}  # noqa: E731
                       for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert strip(out) == strip(sim_out)
    assert flower["bytes"]["wire_down"] > 0 and flower["bytes"]["wire_up"] > flower["bytes"]["up"] > 0
    # TLS and node authentication were on
    superlink_log = (out / "flower" / "superlink.log").read_text()
    assert "--ssl-certfile" in superlink_log and "--enable-supernode-auth" in superlink_log
    assert "--insecure" not in superlink_log
    assert sorted(p.name for p in (out / "flower" / "keys").glob("*.pub")) == ["node-0.pub", "node-1.pub", "node-2.pub"]
    assert len(flower["flower"]["nodes"]) == 3
    assert flower_processes_under(out) == []


class LosingExecutor(SerialExecutor):
    """The simulator, losing the results of ``lost`` clients' training in round ``rnd`` (the reference)."""

    def __init__(self, sim: Simulation, rnd: int, lost: set[int]) -> None:
        super().__init__(ClientRuntime(sim.config, sim.dataset, sim.partition))
        self.rnd, self.lost = rnd, lost

    def map(self, tasks):
        for result in super().map(tasks):
            if not (tasks[0].rnd == self.rnd and not tasks[0].read_only and result.cid in self.lost):
                yield result


def _wait_for_line(path: Path, pattern: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(re.findall(pattern, path.read_text(errors="replace"))) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} did not appear {count} times in {path} within {timeout} s")


def test_a_node_killed_in_a_round_does_not_stop_the_run_and_rejoins_with_its_state(tmp_path):
    """SuperNode 1 is killed (SIGKILL, its whole process tree) after it received round 2's training
    message; round 2 goes on with node 0's replies once --round-timeout passes or node 1 is seen offline; node 1 is restarted
    (a new SuperNode id, the same node config and state folder) and serves round 3 from the state its
    clients kept on disk. The final metrics equal the simulator's with node 1's round-2 replies lost."""
    import threading

    config = algorithm_config("ditto", checkpoint_every=0, rounds=3, fraction=1.0)
    lost = {1, 3, 5}  # node 1 of 2 hosts c with c mod 2 = 1
    dataset, partition = prepare(config)
    reference = Simulation(config, dataset, partition,
                           executor_factory=lambda sim: LosingExecutor(sim, 2, lost)).run()  # fmt: skip

    folder = tmp_path / "flower"
    with LocalDeployment(folder, nodes=2) as deployment:
        log = folder / "node-1.log"

        def kill_and_restart() -> None:
            _wait_for_line(log, r"Receiving: train\.tasks", 2, RUN_TIMEOUT)  # round 2 reached node 1
            deployment.kill_node(1)
            deployment.start_node(1)

        chaos = threading.Thread(target=kill_and_restart, daemon=True)
        chaos.start()
        summary = deployment.run(config, tmp_path / "run", round_timeout=45, timeout=RUN_TIMEOUT)
        chaos.join(timeout=5)
        assert not chaos.is_alive()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    round2 = rows[1]["rounds_log"][0]
    assert round2["missing"] == sorted(lost) and round2["replied"] == 3 and "skipped" not in round2
    assert rows[2]["rounds_log"][0]["replied"] == 6  # node 1's clients are back
    assert summary["final"] == json.loads(json.dumps(reference["final"]))
    # the lost answers were given up on: at the round timeout, or earlier when the SuperLink reported node 1
    # offline or answered for it with an error (which comes first depends on the machine's load)
    lost_by = summary["flower"]
    assert lost_by["exchanges_timed_out"] + lost_by["answers_node_offline"] + lost_by["error_replies"] >= 1
    assert len(re.findall(r"SuperNode ID", (folder / "node-1.log").read_text())) == 2  # it rejoined
    assert flower_processes_under(tmp_path) == []


def test_a_supernode_without_a_registered_key_is_refused(tmp_path):
    """With --auth, a SuperNode whose key was never registered with the SuperLink is refused: it exits
    without joining, and the run goes on with the registered node only."""
    config = algorithm_config("fedavg", checkpoint_every=0, rounds=1, fraction=1.0, partition={"num_clients": 2})
    folder = tmp_path / "flower"
    with LocalDeployment(folder, nodes=1, auth=True) as deployment:
        rogue_key, _ = make_node_key(folder / "rogue", "rogue")  # never registered
        deployment.node_list.append(Node(1, free_port(), f'clients="0,1" state-dir="{folder / "rogue" / "state"}"'))
        rogue = deployment.start_node(1, key=rogue_key)
        assert rogue.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in (folder / "node-1.log").read_text()
        summary = deployment.run(config, tmp_path / "run", timeout=RUN_TIMEOUT)
    assert list(summary["flower"]["nodes"].values()) == [[0, 1]]  # only the registered node served
    assert flower_processes_under(tmp_path) == []


def test_a_killed_serverapp_resumes_from_its_checkpoint_with_the_simulators_results(tmp_path):
    """The ServerApp process is killed (SIGKILL) after its checkpoint of round 2, once round 3's training
    reached the nodes; the run ends without a summary. `--resume` (a new Flower run on the same SuperLink
    and SuperNodes) continues from the checkpoint, the nodes bring their clients back to round 2, and
    the results equal the simulator's, bit for bit."""
    import signal
    import threading

    from fedtail.flower import FlowerError

    config = algorithm_config("ditto", checkpoint_every=2, rounds=4, fraction=1.0)
    dataset, partition = prepare(config)
    reference = Simulation(config, dataset, partition).run()
    folder, out = tmp_path / "flower", tmp_path / "run"
    with LocalDeployment(folder, nodes=2) as deployment:
        killed: list[int] = []

        def kill_serverapp() -> None:
            _wait_for_line(folder / "node-0.log", r"Receiving: train\.tasks", 3, RUN_TIMEOUT)  # round 3 began
            assert (out / "checkpoint.pt").exists()
            for pid in deployment.pids():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if "flwr-serverapp" in cmdline:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

        chaos = threading.Thread(target=kill_serverapp, daemon=True)
        chaos.start()
        with pytest.raises(FlowerError):
            deployment.run(config, out, round_timeout=45, timeout=RUN_TIMEOUT)
        chaos.join(timeout=5)
        assert killed and not (out / "summary.json").exists()
        assert json.loads((out / "checkpoint.json").read_text())["round"] == 2
        summary = deployment.run(config, out, round_timeout=45, timeout=RUN_TIMEOUT, resume=True)
    assert summary["final"] == json.loads(json.dumps(reference["final"]))
    assert [p["from_round"] for p in summary["pieces"]] == [1, 3]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert flower_processes_under(tmp_path) == []
