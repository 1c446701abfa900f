"""The ServerApp's side: the simulator's round loop with client tasks sent over Flower's grid.

:func:`serve` (the ServerApp's ``main``) runs :func:`fedtail.runner.run_to_folder` with
:class:`GridExecutor` as the executor, so sampling, the server half, the reply checks of
:class:`~fedtail.engine.replies.Channel` (dropouts, validation, ``--min-replies``, divergence),
evaluation and the run folder are the simulator's own code.

:class:`GridExecutor` knows which SuperNode hosts which client (each node answers a
``query.hello`` with its clients and a fingerprint of their data, checked against the server's
partition). An exchange sends one Flower message per node holding the tasks of its clients
(their messages, round, call), waits for the answers (at most ``round_timeout`` seconds, and not
for a node that went offline), and yields the results in client-id order. A client whose node
is offline, times out or answers with an error is *missing*: no result, which the channel counts
as a lost reply; a round with fewer than ``--min-replies`` accepted replies is skipped as in the
simulator. Nodes that connect later (a restarted SuperNode) are greeted before the next
exchange and serve their clients from then on, with the state they kept on disk.

**Checkpoints and resuming**: the run writes the simulator's checkpoint every ``--checkpoint-every``
rounds (the server's state; the clients' states stay on the nodes), with this executor's own part
(:meth:`GridExecutor.checkpoint_state`: the run id naming the nodes' state folders, every client's
last accepted reply, those the nodes have yet to confirm). Every message tells the nodes the latest checkpoint's round, so
they keep the client states a resume may need (:mod:`fedtail.flower.node`). A ServerApp started
with ``resume`` continues from ``checkpoint.pt`` in the run folder, as ``fedtail run --resume``
does, and its first message to each node tells it to bring its clients back to the checkpoint's
round: the rounds after it run again from the same state, with the same seeds, so the results
are an unstopped run's.

**Client-level DP**: the nodes receive the run's config, seed included (they cut their data with
it), so under ``--dp-clip`` the sampled clients and the noise are drawn from a secret the executor
draws from the operating system (``privacy_secret``) and keeps in the checkpoint: a DP deployment
is not reproducible from its seed, and equals the simulator's run given the same secret.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fedtail.engine.checkpoint import CheckpointError
from fedtail.engine.executors import Result, Task
from fedtail.flower import FlowerError
from fedtail.flower.codec import get_message, put_message, wire_bytes
from fedtail.flower.node import fingerprint

log = logging.getLogger("fedtail.flower")

TRAIN, EVALUATE, HELLO = "train.tasks", "evaluate.tasks", "query.hello"


@dataclass(frozen=True)
class GridSettings:
    """How the server waits for nodes (the ``flwr run`` run config of the app)."""

    round_timeout: float | None = None  # longest wait for one exchange's answers (None: no limit)
    node_wait: float = 120.0  # how long the start waits for every client to be hosted
    poll: float = 0.2  # seconds between pulls of answers
    liveness_every: float = 2.0  # seconds between checks that the nodes waited for are still online


class GridExecutor:
    """The executor of a Flower deployment (see the module docstring); ``map`` as the simulator's."""

    def __init__(self, sim: Any, grid: Any, settings: GridSettings = GridSettings(), run_id: int | None = None) -> None:
        self.grid = grid
        self.settings = settings
        self.checkpoint_every = sim.config.checkpoint_every
        # names the nodes' state folders (default: the grid's run_id); a resumed run keeps its first run's
        self.state_run = int(getattr(grid, "run_id", 0) if run_id is None else run_id)
        self.accepted: dict[int, tuple[int, int]] = {}  # client -> (round, call) of its last accepted reply
        self.last_checkpoint: int | None = None  # round of the latest checkpoint written or resumed from
        # after a resume: (round, token, the checkpoint's accepted tags) for the nodes not yet told
        self.restore: tuple[int, str, dict[int, tuple[int, int]]] | None = None
        self.restored: set[int] = set()
        # under client-level DP: what draws the sampled clients and the noise instead of the run's seed,
        # which every node holds (fedtail.engine.guard); in the server's checkpoint only
        self.privacy_secret: int | None = secrets.randbits(63) if sim.config.privacy.active else None
        self.num_clients = sim.num_clients
        self.expected = {cid: fingerprint(sim.partition, cid) for cid in range(self.num_clients)}
        self.hosts: dict[int, list[int]] = {}  # node id -> the clients it hosts
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.greeted: set[int] = set()  # nodes that answered hello (or failed to)
        self.devices: dict[int, str] = {}  # node id -> the device its clients compute on (its hello)
        self.sent_tag: dict[int, tuple[int, int]] = {}  # client -> (round, call) of its latest training task
        self.to_confirm: dict[int, tuple[int, int]] = {}  # accepted replies the client's node has not confirmed
        self.wire_down = 0
        self.wire_up = 0
        self.messages = 0
        self.timeouts = 0
        self.offline = 0  # answers given up because their node went offline
        self.errors = 0  # error replies (a node's client app failed)
        # where the time of the exchanges went (summary.json "flower"; benchmarks/flower_rounds.py)
        self.times = {"exchange_s": 0.0, "node_process_start_s": 0.0, "node_handler_s": 0.0, "client_tasks_s": 0.0}
        self.exchanges = 0
        self._wait_for_nodes()

    # -- nodes -------------------------------------------------------------------------------------
    def _online(self) -> set[int]:
        return {int(n) for n in self.grid.get_node_ids()}

    def refresh(self) -> None:
        """Forget nodes that went offline; greet new ones."""
        online = self._online()
        for node in list(self.hosts):
            if node not in online:
                self._forget(node)
        new = sorted(online - self.greeted)
        if new:
            self._hello(new)

    def _forget(self, node: int) -> None:
        for cid in self.hosts.pop(node, []):
            if self.node_of.get(cid) == node:
                del self.node_of[cid]

    def _hello(self, nodes: list[int]) -> None:
        from flwr.app import Message, RecordDict

        messages = [Message(RecordDict(), node, HELLO, group_id="hello") for node in nodes]
        timeout = max(self.settings.round_timeout or 0.0, 60.0)  # a node cuts the partition first
        for node, reply in self._exchange(messages, nodes, timeout).items():
            self.greeted.add(node)
            if reply is None:
                log.warning("node %s did not answer hello", node)
                continue
            record = reply.content.config_records["hello"]
            clients = [int(c) for c in record["clients"]]
            for cid, got in zip(clients, record["fingerprints"]):
                if cid >= self.num_clients or got != self.expected[cid]:
                    raise FlowerError(
                        f"SuperNode {node} hosts client {cid} with other data than the server's partition "
                        "(another dataset, data folder or fedtail version?)"
                    )
            for cid in clients:  # the latest node to announce a client serves it (a restarted node)
                old = self.node_of.get(cid)
                if old is not None and old != node and cid in self.hosts.get(old, []):
                    self.hosts[old].remove(cid)
                self.node_of[cid] = node
            self.hosts[node] = clients
            self.devices[node] = str(record.get("device", "unknown"))
            log.info("node %s hosts clients %s on %s", node, clients, self.devices[node])

    def _wait_for_nodes(self) -> None:
        deadline = time.monotonic() + self.settings.node_wait
        while True:
            self.refresh()
            unhosted = [c for c in range(self.num_clients) if c not in self.node_of]
            if not unhosted:
                return
            if time.monotonic() > deadline:
                raise FlowerError(
                    f"after {self.settings.node_wait:g} s, clients {_ranges(unhosted)} are hosted by no SuperNode "
                    f"({len(self.hosts)} connected); start SuperNodes with --node-config 'clients=\"...\"' "
                    "(or partition-id / num-partitions) covering every client"
                )
            time.sleep(1.0)

    # -- the executor ---------------------------------------------------------------------------------
    def map(self, tasks: list[Task]) -> Iterator[Result]:
        """Send the tasks now (one message per node); the results come, in client-id order, when iterated."""
        from flwr.app import ConfigRecord, Message, RecordDict

        tasks = list(tasks)  # read twice below (the simulator may hand a generator)
        self.refresh()
        by_node: dict[int, list[Task]] = {}
        for task in tasks:
            node = self.node_of.get(task.cid)
            if node is not None:  # a client no online node hosts is missing
                by_node.setdefault(node, []).append(task)
        messages, nodes = [], []
        for node, group in by_node.items():
            content = RecordDict()
            for task in group:
                put_message(content, task.cid, task.message)
                if not task.read_only:
                    self.sent_tag[task.cid] = (task.rnd, task.call)
            confirm = sorted((cid, tag) for cid, tag in self.to_confirm.items() if self.node_of.get(cid) == node)
            content["confirm"] = ConfigRecord(
                {"cids": [c for c, _ in confirm], "rnds": [t[0] for _, t in confirm], "calls": [t[1] for _, t in confirm]}
            )
            content["run"] = self._run_record(node, group[0].rnd)
            content["tasks"] = ConfigRecord(
                {
                    "cids": [t.cid for t in group],
                    "rnds": [t.rnd for t in group],
                    "calls": [t.call for t in group],
                    "read_only": [bool(t.read_only) for t in group],
                }
            )
            kind = EVALUATE if all(t.read_only for t in group) else TRAIN
            messages.append(Message(content, node, kind, group_id=str(group[0].rnd)))
            nodes.append(node)
        pending = self._push(messages, nodes)
        return self._results(pending, {t.cid: t for t in tasks})

    def _run_record(self, node: int, rnd: int) -> Any:
        """The state folder's run, the latest checkpoint's round, and the restore a resumed run owes ``node``."""
        from flwr.app import ConfigRecord

        if self.last_checkpoint is not None:
            checkpointed = self.last_checkpoint
        else:  # none yet: with --checkpoint-every 0 none will be, and no version is needed but the newest
            checkpointed = 0 if self.checkpoint_every else rnd - 1
        rnd0, token, accepted = (0, "", {})
        if self.restore is not None and node not in self.restored:
            rnd0, token, tags = self.restore
            accepted = {cid: tags.get(cid, (-1, -1)) for cid in self.hosts.get(node, [])}
        return ConfigRecord({
            "state-run": self.state_run, "checkpointed": max(0, checkpointed), "restore-round": rnd0,
            "restore-token": token, "restore-cids": list(accepted),
            "restore-rnds": [t[0] for t in accepted.values()], "restore-calls": [t[1] for t in accepted.values()],
        })  # fmt: skip

    def checkpoint_state(self, rnd: int) -> dict[str, Any]:
        """This executor's part of the run's checkpoint after round ``rnd`` (module docstring); from the
        next message on the nodes keep what a resume to ``rnd`` needs and may forget the rest."""
        self.last_checkpoint = rnd
        return {
            "state_run": self.state_run,
            "to_confirm": sorted([cid, *tag] for cid, tag in self.to_confirm.items()),
            "sent_tag": sorted([cid, *tag] for cid, tag in self.sent_tag.items()),
            "accepted": sorted([cid, *tag] for cid, tag in self.accepted.items()),
        } | ({"privacy_secret": self.privacy_secret} if self.privacy_secret is not None else {})

    def restore_checkpoint(self, state: dict[str, Any], rnd: int) -> None:
        """Continue after the checkpoint of round ``rnd``: the nodes are told to go back to it."""
        tags = lambda rows: {int(c): (int(r), int(k)) for c, r, k in rows}  # noqa: E731
        self.state_run = int(state["state_run"])
        self.to_confirm, self.sent_tag, self.accepted = tags(state["to_confirm"]), tags(state["sent_tag"]), tags(state["accepted"])
        if self.privacy_secret is not None:  # the rounds after the checkpoint draw from the run's secret
            if "privacy_secret" not in state:
                raise CheckpointError("the checkpoint holds no DP secret: it is not of this DP run")
            self.privacy_secret = int(state["privacy_secret"])
        self.last_checkpoint = int(rnd)
        self.restore = (int(rnd), uuid.uuid4().hex, dict(self.accepted))
        self.restored = set()
        log.info("resuming after round %d: the nodes bring their clients' states back to it", rnd)

    def _results(self, pending: dict[str, int], tasks: dict[int, Task]) -> Iterator[Result]:
        start = time.perf_counter()
        replies = self._pull(pending, self.settings.round_timeout)
        self.exchanges += 1
        waited = time.perf_counter() - start
        self.times["exchange_s"] += waited
        lost = sorted(node for node, reply in replies.items() if reply is None)
        log.info("exchange %d: %d nodes answered in %.2f s%s", self.exchanges, len(replies) - len(lost), waited,
                 f", no answer from {lost}" if lost else "")
        results = []
        for node, reply in replies.items():
            if reply is None:
                continue
            self.restored.add(node)  # it has applied the resume's restore (if one was owed)
            answers = reply.content.config_records["answers"]
            spent = reply.content.config_records["node"]
            self.times["node_process_start_s"] += float(spent["process_age_s"])
            self.times["node_handler_s"] += float(spent["handler_s"])
            self.times["client_tasks_s"] += float(sum(answers["seconds"]))
            for cid, seconds, where in zip(answers["cids"], answers["seconds"], answers["state_nonfinite"]):
                cid = int(cid)
                results.append(Result(cid, get_message(reply.content, cid), None, float(seconds), where or None))
            for cid in reply.content.config_records["confirmed"]["cids"]:
                self.to_confirm.pop(int(cid), None)
        results.sort(key=lambda r: r.cid)
        yield from (r for r in results if r.cid in tasks)

    def commit(self, cid: int) -> None:
        """The engine accepted ``cid``'s reply: its node keeps the pending state (told with the next message)."""
        self.to_confirm[cid] = self.accepted[cid] = self.sent_tag[cid]

    def close(self) -> None:
        pass

    def summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary.json`` plus the bytes Flower actually sent (every message: training, evaluation, hello)."""
        out = dict(summary)
        out["bytes"] = dict(summary.get("bytes", {})) | {"wire_down": self.wire_down, "wire_up": self.wire_up}
        out["flower"] = {
            "messages": self.messages,
            "exchanges": self.exchanges,
            "exchanges_timed_out": self.timeouts,
            "answers_node_offline": self.offline,
            "error_replies": self.errors,
            # summed over exchanges (exchange_s: the server's wait) and over nodes (the others)
            "time_s": dict(self.times),
            "nodes": {str(node): clients for node, clients in sorted(self.hosts.items())},
            "devices": {str(node): self.devices.get(node, "unknown") for node in sorted(self.hosts)},
        }
        return out

    # -- messages ---------------------------------------------------------------------------------------
    def _exchange(self, messages: list[Any], nodes: list[int], timeout: float | None) -> dict[int, Any]:
        return self._pull(self._push(messages, nodes), timeout)

    def _push(self, messages: list[Any], nodes: list[int]) -> dict[str, int]:
        """Push the messages; message id -> destination node."""
        if not messages:
            return {}
        self.wire_down += sum(wire_bytes(m) for m in messages)
        self.messages += len(messages)
        ids = list(self.grid.push_messages(messages))
        return {mid: node for mid, node in zip(ids, nodes) if mid}

    def _pull(self, pending: dict[str, int], timeout: float | None) -> dict[int, Any]:
        """The answers by node (None: missing) once all came, their nodes went offline, or ``timeout`` passed."""
        settings = self.settings
        start = time.monotonic()
        answers: dict[int, Any] = {node: None for node in pending.values()}
        waiting = dict(pending)
        checked = start
        while waiting:
            for reply in self.grid.pull_messages(list(waiting)):
                node = waiting.pop(reply.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                self.wire_up += wire_bytes(reply)
                if reply.has_error():
                    self.errors += 1
                    log.warning("node %s answered with an error: %s", node, reply.error.reason)
                else:
                    answers[node] = reply
            if not waiting:
                break
            now = time.monotonic()
            if timeout is not None and now - start > timeout:
                self.timeouts += 1
                log.warning("no answer from nodes %s within %g s", sorted(set(waiting.values())), timeout)
                break
            if now - checked > settings.liveness_every:
                checked = now
                online = self._online()
                gone = {mid for mid, node in waiting.items() if node not in online}
                for mid in gone:
                    self.offline += 1
                    log.warning("node %s went offline", waiting.pop(mid))
            time.sleep(settings.poll)
        return answers


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out, start = [], None
    for i, c in enumerate(ids):
        if start is None:
            start = c
        if i + 1 == len(ids) or ids[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def settings_from_run_config(run_config: Any) -> GridSettings:
    timeout = float(run_config.get("round-timeout", 0.0))
    return GridSettings(
        round_timeout=timeout if timeout > 0 else None,
        node_wait=float(run_config.get("node-wait", 120.0)),
    )


def serve(grid: Any, run_config: Any, run_id: int | None = None) -> dict[str, Any]:
    """The ServerApp's work: run ``run_config["config"]`` into the folder ``run_config["out"]``
    (``run_config["resume"]``: from the folder's checkpoint); ``run_id``: this Flower run's id
    (default: the grid's ``run_id``, an in-process grid's)."""
    from fedtail.config import RunConfig
    from fedtail.runner import run_to_folder

    out = Path(str(run_config["out"]))
    if not log.handlers:  # the ServerApp's output is the run's log (flwr run --stream, flwr log)
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s fedtail: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        config = RunConfig.model_validate_json(str(run_config["config"]))
        settings = settings_from_run_config(run_config)
        resume = bool(run_config.get("resume", False))
        return run_to_folder(
            config, out, resume=resume, executor_factory=lambda sim: GridExecutor(sim, grid, settings, run_id)
        )
    except BaseException as err:
        # run_to_folder marks failures once the rounds run; this covers the start (no nodes, bad data)
        if not (out / "FAILED").exists() and not (out / "summary.json").exists():
            out.mkdir(parents=True, exist_ok=True)
            (out / "FAILED").write_text(f"{type(err).__name__}: {err}\n")
        raise
