"""A SuperNode's side: which clients it hosts, their data, their state on disk, running tasks.

**Node config** (``flower-supernode --node-config '...'``):

- ``clients="0,3,5-9"``: the client ids this node hosts (ranges inclusive); or
  ``partition-id=k num-partitions=N``: the clients c with c mod N = k (Flower's usual keys);
- ``state-dir="/var/lib/fedtail"``: where the clients' state is kept (default
  ``~/.cache/fedtail/flower-state``);
- ``data-dir="/data/fmnist"``: where the node finds the dataset files (default: the run's
  ``data_dir``, else the usual places);
- ``device="cuda:1"``: where the node's clients compute (``auto``, the default: the node's first
  GPU, else its CPU; ``cpu``; ``cuda``; ``cuda:N``). The run's own ``device`` is the server's: every
  machine uses its own (messages and states are device-neutral, :mod:`fedtail.engine.device`).

The node cuts the partition from the run's config exactly as the simulator does (the same seed
gives the same clients on every machine) and keeps only the views of its clients.

**Client state** (``ctx.state``) stays on the node: the server never holds or ships it. Flower
starts a new ClientApp process for every message, and ``Context.state`` lives in the
SuperNode's memory, so it would neither hold tensors cheaply nor survive a restart of the
SuperNode; the state is therefore a file per client under
``{state-dir}/run-{state-run}/client-{cid}.pt`` (``torch.save`` of the checkpoint module's plain
containers, read back with ``weights_only=True``, written atomically).

The engine keeps a client's new state only when it accepts the reply (the simulator drops the
state of a rejected reply, of a reply that never came, and of a skipped client). A node cannot
know that when it answers, so a training task's new state is written *pending*
(``client-{cid}.pending.pt``, tagged with its round and call); the server confirms the tags of
accepted replies in its next message to the node, which makes them the client's state. A
pending state that was not confirmed by the time the client's next task arrives is deleted:
the client goes on from its last accepted state, as in the simulator.

**Resuming** (the ServerApp restarted from its checkpoint of round R, ``fedtail flower run
--resume``): a confirmed state does not overwrite the one before it, which is kept as
``client-{cid}.r{round}-{call}.pt`` until the server says (``checkpointed``, in every message) that
a checkpoint supersedes it: then only the newest state of round <= that checkpoint and those
after it are kept. The resumed server's first message to a node says ``restore``, with the tag of
every hosted client's last accepted reply at the checkpoint (part of the checkpoint): the node
makes exactly that version the client's state (a pending one the checkpoint had yet to confirm,
too; none: no state) and deletes the client's other versions; a version that is missing is an
error, never a silent fresh start. Each resume carries a token the node records, so a node that restarts later in the
resumed run does not go back twice. The state folder is named by the run's *first* run id
(``state-run``), which the resumed run (a new Flower run) keeps.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from fedtail.config import DEVICES, RunConfig
from fedtail.engine import checkpoint
from fedtail.engine.device import resolve
from fedtail.engine.executors import ClientRuntime, Task
from fedtail.engine.replies import nonfinite_at
from fedtail.engine.states import ClientStates, Tag
from fedtail.flower import FlowerError
from fedtail.flower.codec import get_message, put_message

DEFAULT_STATE_DIR = Path.home() / ".cache" / "fedtail" / "flower-state"


def parse_clients(text: str) -> list[int]:
    """``"0,3,5-9"`` -> [0, 3, 5, 6, 7, 8, 9]."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                low, high = (int(p) for p in part.split("-"))
                if low > high:
                    raise ValueError
                out.update(range(low, high + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise FlowerError(f"node config clients={text!r}: expected ids and ranges such as \"0,3,5-9\"") from None
    return sorted(out)


@dataclass(frozen=True)
class NodeSettings:
    """What a node's ``--node-config`` says (see the module docstring)."""

    clients: tuple[int, ...] | None  # None: partition-id / num-partitions decide, given the run's client count
    partition_id: int | None
    num_partitions: int | None
    state_dir: Path
    data_dir: str | None
    device: str = "auto"

    @classmethod
    def from_node_config(cls, node_config: Any) -> "NodeSettings":
        cfg = dict(node_config)
        clients = tuple(parse_clients(cfg["clients"])) if "clients" in cfg else None
        pid, parts = cfg.get("partition-id"), cfg.get("num-partitions")
        if clients is None and (pid is None or parts is None):
            raise FlowerError(
                "this SuperNode hosts no client: start it with --node-config 'clients=\"0,1\"' "
                "or 'partition-id=K num-partitions=N'"
            )
        if clients is None and not (isinstance(pid, int) and isinstance(parts, int) and 0 <= pid < parts):
            raise FlowerError(f"node config: need 0 <= partition-id < num-partitions (got {pid}, {parts})")
        state_dir = Path(str(cfg.get("state-dir", DEFAULT_STATE_DIR))).expanduser()
        data_dir = cfg.get("data-dir")
        device = str(cfg.get("device", "auto")).strip().lower()
        if not re.fullmatch(DEVICES, device):
            raise FlowerError(f"node config device={cfg.get('device')!r}: expected auto, cpu, cuda or cuda:N")
        return cls(clients, pid, parts, state_dir, None if data_dir is None else str(data_dir), device)

    def hosted(self, num_clients: int) -> list[int]:
        """The run's clients this node hosts."""
        if self.clients is not None:
            bad = [c for c in self.clients if c >= num_clients]
            if bad:
                raise FlowerError(f"node config clients: {bad} do not exist (the run has {num_clients} clients)")
            return list(self.clients)
        return [c for c in range(num_clients) if c % self.num_partitions == self.partition_id]


class StateStore(ClientStates):
    """The clients' states of one run on this node's disk (module docstring: committed and pending),
    a :class:`~fedtail.engine.states.ClientStates`: each write is fsynced, and a pending state
    carries the (round, call) tag the server confirms it by, so a node restarted between the
    reply and the confirmation still accepts the right state."""

    def __init__(self, root: Path, run_id: int) -> None:
        self.dir = Path(root) / f"run-{run_id}"

    def _path(self, cid: int, pending: bool = False) -> Path:
        return self.dir / (f"client-{cid}.pending.pt" if pending else f"client-{cid}.pt")

    def _kept(self, cid: int, tag: Tag) -> Path:
        """An earlier accepted state, kept for a resume (module docstring)."""
        return self.dir / f"client-{cid}.r{tag[0]}-{tag[1]}.pt"

    def _versions(self) -> dict[int, list[tuple[Tag, Path]]]:
        """Client -> its accepted states (those kept and the current one), oldest first."""
        out: dict[int, list[tuple[Tag, Path]]] = {}
        if not self.dir.is_dir():
            return out
        for path in self.dir.glob("client-*.pt"):
            found = re.fullmatch(r"client-(\d+)(?:\.r(\d+)-(\d+))?\.pt", path.name)
            if found is None:
                continue
            cid = int(found.group(1))
            if found.group(2) is None:
                saved = self._read(path)
                tag: Tag = tuple(saved["tag"]) if saved is not None and saved["tag"] else (0, 0)  # type: ignore[assignment]
            else:
                tag = (int(found.group(2)), int(found.group(3)))
            out.setdefault(cid, []).append((tag, path))
        return {cid: sorted(v, key=lambda item: (item[0], item[1].name == f"client-{cid}.pt")) for cid, v in out.items()}

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None

    def _write(self, path: Path, tag: Tag | None, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with checkpoint.open_private(tmp) as fh:
            torch.save({"tag": list(tag or ()), "state": checkpoint.encode(state, "client state")}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # a node killed while writing leaves the previous file

    # -- the mapping of accepted states ------------------------------------------------------------
    def __getitem__(self, cid: int) -> dict[str, Any]:
        saved = self._read(self._path(int(cid)))
        if saved is None:
            raise KeyError(cid)
        return checkpoint.decode(saved["state"])

    def __setitem__(self, cid: int, state: dict[str, Any]) -> None:
        self._write(self._path(int(cid)), None, state)

    def __delitem__(self, cid: int) -> None:
        path = self._path(int(cid))
        if not path.is_file():
            raise KeyError(cid)
        path.unlink()

    def __contains__(self, cid: object) -> bool:
        try:
            return self._path(int(cid)).is_file()  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False

    def __iter__(self) -> Iterator[int]:
        names = (p.name for p in self.dir.glob("client-*.pt")) if self.dir.is_dir() else ()
        return iter(sorted(int(found.group(1)) for n in names if (found := re.fullmatch(r"client-(\d+)\.pt", n))))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def load(self, cid: int) -> dict[str, Any]:
        """The client's accepted state ({} before its first accepted reply)."""
        return self.get(cid, {})

    # -- pending states ----------------------------------------------------------------------------
    def hold(self, cid: int, state: dict[str, Any], tag: Tag | None = None) -> None:
        self._write(self._path(cid, pending=True), tag, state)

    def accept(self, cid: int, tag: Tag | None = None) -> bool:
        """Make the pending state of ``tag`` the client's state; True when it is (now or already)."""
        pending = self._path(cid, pending=True)
        saved = self._read(pending)
        if saved is not None and (tag is None or tuple(saved["tag"]) == tuple(tag)):
            current = self._read(self._path(cid))
            if current is not None and current["tag"]:  # kept until a checkpoint supersedes it
                os.replace(self._path(cid), self._kept(cid, tuple(current["tag"])))  # type: ignore[arg-type]
            os.replace(pending, self._path(cid))
            return True
        current = self._read(self._path(cid))
        return current is not None and tag is not None and tuple(current["tag"]) == tuple(tag)

    def drop(self, cid: int) -> None:
        """Forget a pending state the server did not confirm (its reply was rejected or lost)."""
        self._path(cid, pending=True).unlink(missing_ok=True)

    # -- resuming (module docstring) -----------------------------------------------------------------
    def prune(self, checkpointed: int) -> None:
        """Keep, of every client's accepted states, the newest of round <= ``checkpointed`` and the later ones."""
        for versions in self._versions().values():
            older = [path for tag, path in versions if tag[0] <= checkpointed]
            for path in older[:-1]:
                path.unlink(missing_ok=True)

    def restore(self, accepted: dict[int, Tag | None], token: str) -> bool:
        """Every client of ``accepted`` back to the state of its accepted tag at the checkpoint (None: no
        state), every other version of it deleted; once per ``token``. True when it was done now."""
        marker = self.dir / f"restored-{token}"
        if marker.exists():
            return False
        versions = self._versions()
        for cid, tag in accepted.items():
            found = [path for t, path in versions.get(cid, []) if tag is not None and t == tuple(tag)]
            pending = self._read(self._path(cid, pending=True))
            if not found and tag is not None and pending is not None and tuple(pending["tag"]) == tuple(tag):
                found = [self._path(cid, pending=True)]
            if tag is not None and not found:
                raise FlowerError(
                    f"client {cid}: its state of round {tag[0]} (call {tag[1]}), which the checkpoint needs, is not in {self.dir}"
                )
            if found and found[0] != self._path(cid):
                os.replace(found[0], self._path(cid))
            for _, path in versions.get(cid, []):
                if path != self._path(cid) or not found:
                    path.unlink(missing_ok=True)
            self._path(cid, pending=True).unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        marker.write_text("restored\n")
        return True


class NodeRuntime:
    """The engine's client runtime for one run on this node: the dataset, the partition, the views."""

    def __init__(self, config: RunConfig, settings: NodeSettings) -> None:
        from fedtail.engine import prepare

        if settings.data_dir is not None:
            config = config.model_copy(update={"data_dir": settings.data_dir})
        self.config = config
        dataset, partition = prepare(config, server=False)  # a node clips under DP; the server accounts
        self.num_clients = len(partition.clients)
        self.hosted = settings.hosted(self.num_clients)
        self.runtime = ClientRuntime(config, dataset, partition, resolve(settings.device))
        self.fingerprints = {cid: fingerprint(partition, cid) for cid in self.hosted}


def fingerprint(partition: Any, cid: int) -> str:
    """A short hash of client ``cid``'s sample indices: the server checks that nodes cut its partition."""
    import hashlib

    client = partition.clients[cid]
    digest = hashlib.sha256()
    for part in (client.train, client.test, client.val):
        digest.update(torch.as_tensor(part, dtype=torch.int64, device="cpu").numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


_RUNTIMES: dict[tuple[str, NodeSettings], NodeRuntime] = {}


def node_runtime(config_json: str, settings: NodeSettings) -> NodeRuntime:
    """The runtime of a run's config on this node (kept for the process: several in-process nodes share it)."""
    key = (config_json, settings)
    if key not in _RUNTIMES:
        _RUNTIMES.clear()  # one run at a time per process
        _RUNTIMES[key] = NodeRuntime(RunConfig.model_validate_json(config_json), settings)
    return _RUNTIMES[key]


# --- the two messages a node answers ------------------------------------------------------------------


def hello(run_config: Any, node_config: Any) -> dict[str, Any]:
    """The ``query.hello`` answer: the clients this node hosts and their data fingerprints."""
    settings = NodeSettings.from_node_config(node_config)
    node = node_runtime(str(run_config["config"]), settings)
    return {
        "clients": list(node.hosted),
        "fingerprints": [node.fingerprints[c] for c in node.hosted],
        "device": str(node.runtime.device),
    }


def run_tasks(content: Any, run_config: Any, node_config: Any) -> Any:
    """Answer a ``train.tasks`` / ``evaluate.tasks`` message: confirm states, run each client's task.

    ``content`` holds ``"run"`` (the state folder's run id, the latest checkpoint's round, a restore
    after a resume), ``"tasks"`` (cid, round, call, read-only per task), ``"confirm"`` (tags of
    accepted replies) and each task's message records; the reply holds ``"answers"`` (per task: the
    compute seconds and where its state holds NaN / inf, if anywhere), ``"confirmed"`` and each
    reply's records.
    """
    from flwr.app import ConfigRecord, RecordDict

    began = time.perf_counter()
    age = process_age()  # Flower starts a process per message: its start-up is part of each exchange
    settings = NodeSettings.from_node_config(node_config)
    node = node_runtime(str(run_config["config"]), settings)
    run = content.config_records["run"]
    store = StateStore(settings.state_dir, int(run["state-run"]))  # the first run's id: a resumed run keeps it
    if str(run["restore-token"]):  # the ServerApp resumed from its checkpoint: its accepted tags (round -1: none)
        accepted = {int(c): (int(r), int(k)) if int(r) >= 0 else None
                    for c, r, k in zip(run["restore-cids"], run["restore-rnds"], run["restore-calls"])}  # fmt: skip
        store.restore(accepted, str(run["restore-token"]))
    confirm = content.config_records["confirm"]
    confirmed = []
    for cid, rnd, call in zip(confirm["cids"], confirm["rnds"], confirm["calls"]):
        if store.accept(int(cid), (int(rnd), int(call))):
            confirmed.append(int(cid))
    store.prune(int(run["checkpointed"]))
    tasks = content.config_records["tasks"]
    reply = RecordDict()
    seconds, nonfinite = [], []
    for cid, rnd, call, read_only in zip(tasks["cids"], tasks["rnds"], tasks["calls"], tasks["read_only"]):
        cid, rnd, call = int(cid), int(rnd), int(call)
        if cid not in node.hosted:
            raise FlowerError(f"this node does not host client {cid} (it hosts {node.hosted})")
        if not read_only:
            store.drop(cid)  # an unconfirmed state of an earlier call: its reply was not accepted
        result = node.runtime.run(Task(cid, rnd, call, get_message(content, cid), store.load(cid), read_only=bool(read_only)))
        where = None
        if not read_only:
            where = nonfinite_at(result.state)
            store.hold(cid, result.state, (rnd, call))
        seconds.append(result.seconds)  # the client's compute, as the simulator counts it
        nonfinite.append(where or "")
        put_message(reply, cid, result.reply)
    reply["answers"] = ConfigRecord(
        {"cids": [int(c) for c in tasks["cids"]], "seconds": seconds, "state_nonfinite": nonfinite}
    )
    # where a node's time went: the process before this handler, then this handler (data, state, tasks)
    reply["node"] = ConfigRecord({"process_age_s": age, "handler_s": time.perf_counter() - began})
    reply["confirmed"] = ConfigRecord({"cids": confirmed})
    return reply


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0.0 elsewhere)."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
