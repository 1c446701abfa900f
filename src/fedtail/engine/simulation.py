"""The single-machine simulation engine: the round loop, the message channel, evaluation.

The loop itself knows nothing about any algorithm: each round it samples clients from a
seeded stream, lets the algorithm's server half run the round through a :class:`SimComm`,
and every ``eval_every`` rounds evaluates ALL clients plus the global model, if any.
Evaluation never changes client state or random streams, so how often one evaluates never
changes the trajectory.

Checkpoints (``checkpoint_every`` rounds): :meth:`Simulation.checkpoint_state` is everything
the rounds after it depend on (:mod:`fedtail.engine.checkpoint`); a new simulation given it by
:meth:`Simulation.restore` continues bit-identically to one that was never stopped.

Client state (``--client-state``): ``client_state`` maps a client id to its ``ctx.state``, in
memory or on disk (:mod:`fedtail.engine.states`); the tasks of an exchange or an evaluation are
built one at a time, so a disk store holds only the state of the client being served.

Stage tasks (``--partition stages``, M stages): each round trains one stage task, the clients
its stage-m data only, and evaluations test the stages trained so far (the client views of the
executors do that, by round). ``--stage-schedule nested`` (default): rounds of global
optimisation of M rounds, one per stage task, with the same sampled clients, evaluated at their
ends; ``blocks``: M consecutive equal blocks of rounds, the last round of every block evaluated
too. Each row adds the stage and the metrics of :mod:`fedtail.metrics.stages`.

Time: ``wall_time_s`` and each row's ``elapsed_s`` are wall seconds from the run's start (a
restored checkpoint's included), less the seconds the process was stopped (``suspended_s`` in
``summary.json``; :mod:`fedtail.engine.clock`).

Named accuracies: a client's evaluation reply may carry ``correct:NAME`` counts beside the
headline ones (several prediction rules of one model, e.g. GLDP's global and local prototypes
and its classifier); each row then adds ``named[NAME]``, the personalised metrics of each.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from fedtail import components, wire
from fedtail.algorithms.base import EdgeHalf, Message, ServerHalf
from fedtail.config import RunConfig
from fedtail.data.base import Dataset
from fedtail.engine import checkpoint, guard
from fedtail.engine.callbacks import Callback
from fedtail.engine.clock import RunClock
from fedtail.engine.context import ServerContext, Workspace, derive_seed, initial_weights, load_weights
from fedtail.engine.device import configure, resolve, to_host
from fedtail.engine.executors import ClientRuntime, SerialExecutor, Task, Views, make_executor
from fedtail.engine.replies import Channel, Delivered, ReplyCheck, RoundSkipped, nonfinite_at
from fedtail.engine.states import ClientStates, make_states
from fedtail.engine.training import evaluate
from fedtail.errors import ConfigError, RunDiverged
from fedtail.metrics import Meter, RunRecord, global_metrics, personalized_metrics, stage_metrics
from fedtail.metrics.record import NAMED_KEYS
from fedtail.metrics.stages import StageCounts, local_metrics
from fedtail.metrics.similarity import class_probabilities, client_similarity
from fedtail.metrics.segmentation import global_segmentation, personalized_segmentation
from fedtail.partition import Partition

EVAL_CALL = 1 << 20  # call index of evaluation tasks: their seeds never collide with training's


def sample_clients(seed: int, rnd: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``rnd``: a function of (seed, round) only, so resuming is exact."""
    rng = np.random.default_rng(derive_seed(seed, 0x5A3, rnd))
    return sorted(int(c) for c in rng.choice(num_clients, size=per_round, replace=False))


def assign_edges(config: RunConfig, num_clients: int) -> np.ndarray:
    """Client id -> edge server id, by the configured rule."""
    cids = np.arange(num_clients)
    if config.edges > num_clients:
        raise ConfigError(f"edges must be <= the number of clients ({num_clients}) (got {config.edges})")
    if config.edge_assignment == "contiguous":
        return cids * config.edges // num_clients
    if config.edge_assignment == "round-robin":
        return cids % config.edges
    perm = np.random.default_rng(derive_seed(config.seed, 0xED6E)).permutation(num_clients)
    return perm % config.edges


class SimComm(Channel):
    """The server half's channel to the clients in the simulator (see ``algorithms.base.Comm``):
    client tasks run through the executor; the checks are :class:`~fedtail.engine.replies.Channel`'s."""

    def __init__(self, sim: "Simulation", rnd: int, clients: list[int]) -> None:
        config = sim.config
        super().__init__(rnd, clients, sim.reply_check, config.faults, config.seed, sim.server_ctx.edge_of)
        self.sim = sim
        self.client_wall = 0.0

    def _deliver(self, messages: dict[int, Message], call: int) -> Iterator[Delivered]:
        sim = self.sim
        for cid in messages:
            if not 0 <= cid < sim.num_clients:
                raise ValueError(f"message for unknown client {cid}")
        tasks = sim.lazily(Task(cid, self.rnd, call, msg, sim.client_state.get(cid, {})) for cid, msg in messages.items())
        sim.meter.exchanges += 1
        results = sim.executor.map(tasks)
        while True:
            start = time.perf_counter()
            try:
                result = next(results)
            except StopIteration:
                self.client_wall += time.perf_counter() - start
                return
            self.client_wall += time.perf_counter() - start
            sim.meter.client_task_s += result.seconds
            yield Delivered(result.cid, result.reply, result.seconds, result.state, result.state_nonfinite)

    def _hold(self, answer: Delivered) -> Delivered:
        if answer.state is None:  # the state stays where the client ran (a Flower node)
            return answer
        # the store keeps the state as pending until the answer is accepted (a disk store on disk: memory holds the replies only)
        where = nonfinite_at(answer.state)
        self.sim.client_state.hold(answer.cid, answer.state)
        return dataclasses.replace(answer, state=None, state_nonfinite=where, parked=True)

    def _accept(self, answer: Delivered) -> None:
        if answer.parked:
            self.sim.client_state.accept(answer.cid)
        elif answer.state is not None:  # None: the state stays where the client ran (a Flower node)
            self.sim.client_state[answer.cid] = answer.state
        self.sim.executor.commit(answer.cid)

    def _reject(self, answer: Delivered) -> None:
        if answer.parked:
            self.sim.client_state.drop(answer.cid)

    def _edge_reduce(self, edge_id: int, replies: dict[int, Message]) -> dict[int, Message]:
        return self.sim.edge.reduce(edge_id, replies)


@dataclass
class Simulation:
    """One run of one algorithm on one partitioned dataset."""

    config: RunConfig
    dataset: Dataset
    partition: Partition
    # told of the run's start, evaluations, rounds and end, in list order (engine/callbacks.py)
    callbacks: Sequence[Callback] = ()
    meter: Meter = field(default_factory=Meter)
    # client id -> the client's ctx.state; None: the store --client-state names (engine/states.py)
    client_state: ClientStates | None = None
    # builds the executor from the simulation (a Flower deployment's); None: serial or a process pool
    executor_factory: Callable[["Simulation"], Any] | None = None
    # the run folder, where --client-state disk keeps its files (None: a temporary folder)
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        config = self.config
        if self.client_state is None:
            self.client_state = make_states(config.client_state, self.run_dir)
        torch.set_num_threads(config.threads)
        self.device = resolve(config.device)
        configure(self.device, config.deterministic)
        self.num_clients = len(self.partition.clients)
        self.spec = components.algorithm(config.algorithm)
        options = components.algorithm_options(config)
        host_dataset = self.dataset
        self.workspace = Workspace(config, host_dataset, self.device)
        self.dataset = self.workspace.dataset  # on the device: the server's models and the evaluations use it
        self.server_ctx = ServerContext(
            config=config,
            options=options,
            workspace=self.workspace,
            partition=self.partition,
            client_train_sizes=np.array([len(c.train) for c in self.partition.clients]),
            init_weights=initial_weights(config, self.dataset),
            edge_of=assign_edges(config, self.num_clients),
        )
        self.reply_check = ReplyCheck(config.faults, self.server_ctx.init_weights)
        self.server: ServerHalf = self.spec.server(self.server_ctx)
        self.edge = (self.spec.edge or EdgeHalf)(self.server_ctx)
        self.groups = self.partition.class_frequency_groups()
        self.record = RunRecord(list(config.targets))
        self.round_logs: list[dict[str, Any]] = []
        self.rounds_done = 0  # rounds completed (those of a restored checkpoint included)
        # --sample-masks: the final evaluation's images, true and predicted masks (runner: masks.npz)
        self.masks: dict[str, np.ndarray] | None = None
        self.clock = RunClock()  # wall seconds, the process's stops left out (engine/clock.py)
        self.elapsed_before = 0.0  # wall seconds spent before a restored checkpoint
        self.suspended_before = 0.0  # ... and the stops left out of them
        local = self.executor_factory is None
        serial = local and config.workers == 1
        runtime = ClientRuntime(config, self.dataset, self.partition, self.device) if serial else None
        self.executor = make_executor(config, host_dataset, self.partition, runtime) if local else self.executor_factory(self)
        # The clients' data views by round (stage runs: the seen-stage data of the global model's A_global).
        self.views = runtime.views if runtime else Views(config, self.partition, self.dataset)

    @property
    def privacy_seed(self) -> int:
        """What draws the sampled clients and the DP noise: the run's seed, or the secret of an executor
        whose clients are remote (``privacy_secret``: a Flower deployment's under DP, which the nodes
        never see; :mod:`fedtail.engine.guard`)."""
        return self.config.seed if self._secret is None else int(self._secret)

    @property
    def _secret(self) -> int | None:
        return getattr(self.executor, "privacy_secret", None)

    # -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The remaining rounds (all, or those after a restored checkpoint); returns the summary."""
        config = self.config
        self.clock.start(self.elapsed_before, self.suspended_before)
        try:
            for cb in self.callbacks:
                cb.on_run_start(self, self.rounds_done)
            for rnd in range(self.rounds_done + 1, config.rounds + 1):
                self.run_round(rnd)
                row = None
                if config.plan.evaluates(rnd):
                    row = self.evaluate(rnd)
                self.rounds_done = rnd
                for cb in self.callbacks:
                    cb.on_round_end(self, rnd, row)
        finally:
            self.executor.close()
            self.client_state.close()  # a disk store's folder goes with the run
        summary = self.record.summary(self.meter, self.clock.elapsed(), config.rounds)
        summary["suspended_s"] = self.clock.suspended()
        summary |= guard.run_summary(config, self.rounds_done, self._secret is not None)
        for cb in self.callbacks:
            cb.on_run_end(self, summary)
        return summary

    def elapsed(self) -> float:
        """Wall seconds of the run so far (those before a restored checkpoint included), stops excluded."""
        return self.clock.elapsed()

    def lazily(self, tasks: Iterator[Task]) -> Iterator[Task] | list[Task]:
        """``tasks`` as the executor takes them: built one at a time for the engine's in-process
        executor, so a disk store (--client-state disk) holds one client's state in memory; a list for
        the others (a process pool reads its input from another thread, which must not call into the
        server half; an executor given by ``executor_factory`` is promised a list)."""
        return tasks if type(self.executor) is SerialExecutor else list(tasks)

    def diverged_summary(self, err: RunDiverged) -> dict[str, Any]:
        """``summary.json`` of a run that :meth:`run` stopped with ``err``."""
        summary = self.record.diverged(self.meter, self.clock.elapsed(), self.config.rounds, err.round, err.cause)
        summary["suspended_s"] = self.clock.suspended()
        summary |= guard.run_summary(self.config, self.rounds_done, self._secret is not None)  # ε so far
        return summary | {"rounds_log": self.round_logs}  # the rounds after the last evaluation row

    def checkpoint_state(self, elapsed: float) -> dict[str, Any]:
        """The state after round ``rounds_done``, as plain containers (see :mod:`fedtail.engine.checkpoint`)."""
        enc = checkpoint.encode
        return {
            "format": checkpoint.FORMAT,
            "version": checkpoint.VERSION,
            "config": self.config.model_dump(mode="json"),
            "round": self.rounds_done,
            "elapsed_s": elapsed,
            "suspended_s": self.clock.suspended(),
            # device-neutral: a checkpoint written on a GPU resumes on a CPU and back
            "server": enc(to_host(self.server.state_dict()), f"{self.config.algorithm} server state"),
            "edge": enc(to_host(self.edge.state_dict()), f"{self.config.algorithm} edge state"),
            "clients": {cid: enc(s, f"client {cid}'s state") for cid, s in self.client_state.items()},
            "meter": self.meter.as_dict(),
            "rows": enc(self.record.rows, "metrics rows"),
            "round_logs": enc(self.round_logs, "round logs"),
            "rng": checkpoint.rng_state(),
        } | ({"executor": self.executor.checkpoint_state(self.rounds_done)} if hasattr(self.executor, "checkpoint_state") else {})

    def restore(self, state: dict[str, Any]) -> None:
        """Continue after the checkpoint ``state`` (of this run's config): :meth:`run` does the rest."""
        if state["round"] >= self.config.rounds:
            raise checkpoint.CheckpointError(
                f"the checkpoint is of round {state['round']}, the run has {self.config.rounds}"
            )
        dec = checkpoint.decode
        self.server.load_state_dict(dec(state["server"]))
        self.edge.load_state_dict(dec(state["edge"]))
        self.client_state.clear()
        for cid, s in state["clients"].items():
            self.client_state[int(cid)] = dec(s)
        self.meter = Meter(**state["meter"])
        self.record.rows = dec(state["rows"])
        self.round_logs = dec(state["round_logs"])
        self.rounds_done = state["round"]
        self.elapsed_before = state["elapsed_s"]
        self.suspended_before = state.get("suspended_s", 0.0)  # absent from checkpoints before engine/clock.py
        checkpoint.set_rng_state(state["rng"])
        if "executor" in state and not hasattr(self.executor, "restore_checkpoint"):
            raise checkpoint.CheckpointError("the checkpoint is of a Flower run, whose client states are on its nodes: resume it on Flower")
        if hasattr(self.executor, "restore_checkpoint"):  # a Flower deployment's: the nodes hold the client states
            if "executor" not in state:
                raise checkpoint.CheckpointError("the checkpoint is of a simulator run; a Flower run cannot resume from it")
            self.executor.restore_checkpoint(state["executor"], state["round"])

    def run_round(self, rnd: int) -> None:
        """One round; a round with too few replies is undone (server and edge state as before it).

        Raises :class:`RunDiverged` when a reply, the server's state or the edges' state holds NaN / inf.
        """
        # With nested stages the clients of a round of global optimisation train all its stage tasks.
        clients = sample_clients(self.privacy_seed, self.config.plan.global_round(rnd), self.num_clients,
                                 self.config.clients_per_round)
        self.server_ctx.set_stage(self.config.plan.stage_of(rnd))
        comm = SimComm(self, rnd, clients)
        before = copy.deepcopy((checkpoint.encode(self.server.state_dict()), checkpoint.encode(self.edge.state_dict())))
        start = time.perf_counter()
        try:
            with guard.server_aggregation(self.config, rnd, self.privacy_seed):  # --aggregate, DP noise (engine.guard)
                self.server.run_round(rnd, clients, comm)
        except RoundSkipped as skip:
            self.server.load_state_dict(checkpoint.decode(before[0]))
            self.edge.load_state_dict(checkpoint.decode(before[1]))
            comm.round.skipped = str(skip)
        finally:
            elapsed = time.perf_counter() - start
            meter = self.meter
            meter.client_s += comm.client_wall
            meter.server_s += elapsed - comm.client_wall
            meter.bytes_down += comm.bytes_down
            meter.bytes_up += comm.bytes_up
            meter.bytes_edge_up += comm.bytes_edge_up
            meter.samples_trained += comm.samples
            self.round_logs.append(
                {"round": rnd, "clients": clients, "train_loss": comm.train_loss, "samples": comm.samples}
                | comm.round.log()
                | comm.logged
            )
        for what, half in (("the server's state", self.server), ("the edges' state", self.edge)):
            where = nonfinite_at(half.state_dict())
            if where:
                raise RunDiverged(rnd, f"non-finite value in {what} ({where})")

    def evaluate(self, rnd: int) -> dict[str, Any]:
        start = time.perf_counter()
        config = self.config
        cids = list(range(self.num_clients))
        tasks = self.lazily(
            Task(cid, rnd, EVAL_CALL, to_host(self.server.evaluation_message(cid)), self.client_state.get(cid, {}), read_only=True)
            for cid in cids
        )
        # A process pool starts on the client tasks at once, so the global evaluation below
        # overlaps with them; results are read afterwards, in client order.
        results = self.executor.map(tasks)
        row: dict[str, Any] = {"round": rnd}
        weights = self.server.global_weights() if config.eval_global else None
        global_row: dict[str, Any] = {"global_acc": None}
        global_seen = None
        if weights is not None:
            model = self.workspace.model("global-eval")
            load_weights(model, weights)
            counts = evaluate(model, self.dataset, self.dataset.test, None, self.dataset.num_classes,
                              probabilities=config.class_probabilities)  # fmt: skip
            global_row = global_metrics(counts.correct.numpy(), counts.total.numpy(), self.groups)
            if counts.confusion is not None:
                global_row |= global_segmentation(counts.confusion.numpy(), self.groups)
            if counts.prob_sum is not None:
                global_row |= class_probabilities(counts)
            if config.plan.has_stages:
                global_seen = self._global_seen_counts(rnd, model)
        models: dict[int, torch.Tensor] = {}
        confusions: dict[int, torch.Tensor] = {}
        masks: dict[int, torch.Tensor] = {}
        main, named, local, answered = self._gather(results, rnd, models, confusions, masks)
        if masks:
            self.masks = self._sample_masks(rnd, masks)
        row |= personalized_metrics(main.correct, main.total, self.groups)
        if self.dataset.segmentation:
            C = self.dataset.num_classes
            matrices = np.zeros((self.num_clients, C, C), dtype=np.int64)
            for cid, m in confusions.items():
                matrices[cid] = m.numpy()
            row |= personalized_segmentation(matrices, self.groups)
        if models:
            row["client_similarity"] = self._similarity(models)
        if len(answered) < len(cids):  # a transport lost them (a Flower node down): left out of the means
            row["eval_missing"] = sorted(set(cids) - answered)
        row |= global_row
        participants = self.round_logs[-1]["clients"] if self.round_logs else []
        if config.plan.has_stages:
            row |= {"stage": config.plan.stage_of(rnd), "seen_stages": config.plan.seen_stages(rnd)}
            if config.plan.schedule == "nested":
                row["global_round"] = config.plan.global_round(rnd)
            row |= stage_metrics(local or main, participants, global_seen)
        if named:
            row["named"] = {name: self._named_metrics(counts, main, participants) for name, counts in named.items()}
        losses = [r["train_loss"] for r in self.round_logs if r["train_loss"] is not None]
        row["train_loss"] = self.round_logs[-1]["train_loss"] if self.round_logs else None
        row["train_loss_since_last_eval"] = float(np.mean(losses)) if losses else None
        if config.privacy.active:  # ε spent so far at the run's δ (fedtail.engine.guard; None: z = 0)
            eps = guard.epsilon(config, rnd)
            row["epsilon"] = eps if np.isfinite(eps) else None
        self.meter.eval_s += time.perf_counter() - start
        row["elapsed_s"] = self.clock.elapsed()  # the run's wall seconds to the end of this evaluation
        row["samples_trained"] = self.meter.samples_trained
        row["bytes_down"] = self.meter.bytes_down
        row["bytes_up"] = self.meter.bytes_up
        row["rounds_log"] = self.round_logs
        self.round_logs = []
        self.record.add(row)
        for cb in self.callbacks:
            cb.on_evaluation(self, row)
        return row

    def _gather(
        self, results, rnd: int, models: dict[int, torch.Tensor] | None = None,
        confusions: dict[int, torch.Tensor] | None = None, masks: dict[int, torch.Tensor] | None = None,
    ) -> tuple[StageCounts, dict[str, StageCounts], StageCounts | None, set[int]]:
        """The clients' evaluation replies as count arrays (evaluation never writes client state).

        Returns the headline counts, those of every named accuracy (``correct:NAME`` in a reply)
        and, for methods without personalised models in stage runs, those of the clients' local
        models (the headline counts for a client without one yet); the per-stage arrays are empty
        without stage tasks; and the clients that answered. The evaluated models a reply carries
        (``--similarity-rounds``) go into ``models``, a segmentation reply's confusion matrix into
        ``confusions``.
        """
        n, C = self.num_clients, self.dataset.num_classes
        stages = self.config.plan.seen_stages(rnd) if self.config.plan.has_stages else 0

        def empty() -> StageCounts:
            shapes = ((n, C), (n, C), (n, stages, C), (n, stages, C))
            return StageCounts(*(np.zeros(shape, dtype=np.int64) for shape in shapes))

        def fill(into: StageCounts, cid: int, t: dict[str, torch.Tensor], name: str = "") -> None:
            into.correct[cid] = t[wire.correct_key(name)].numpy()
            into.total[cid] = t[wire.TOTAL].numpy()
            if stages:
                into.by_stage_correct[cid] = t[wire.stage_key(wire.correct_key(name))].numpy()
                into.by_stage_total[cid] = t[wire.stage_key(wire.TOTAL)].numpy()

        main, named = empty(), {}
        local = empty() if stages and not self.spec.personal_model else None
        answered: set[int] = set()
        for result in results:
            answered.add(result.cid)
            t = result.reply.tensors
            fill(main, result.cid, t)
            for name in wire.named_accuracies(t):
                fill(named.setdefault(name, empty()), result.cid, t, name)
            if local is not None:
                fill(local, result.cid, (result.local or result.reply).tensors)
            if models is not None and wire.EVAL_MODEL in t:
                models[result.cid] = t[wire.EVAL_MODEL]
            if confusions is not None and wire.CONFUSION in t:
                confusions[result.cid] = t[wire.CONFUSION]
            if masks is not None and wire.EVAL_MASKS in t:
                masks[result.cid] = t[wire.EVAL_MASKS]
        return main, named, local, answered

    def _sample_masks(self, rnd: int, predicted: dict[int, torch.Tensor]) -> dict[str, np.ndarray]:
        """The clients' sampled masks with their images and true masks (each client's labelling),
        as arrays: ``clients`` (n,), ``index`` (n, K) rows of the evaluated split (−1: none),
        ``images`` (n, K, C, H, W) uint8, ``truth`` (n, K, H, W) int16 (−100: ignored) and
        ``predicted`` (n, K, H, W) int16 (−1: none)."""
        cids = sorted(predicted)
        k = max(len(predicted[c]) for c in cids)
        shape = self.dataset.input_shape
        out = {
            "clients": np.array(cids, dtype=np.int64),
            "index": np.full((len(cids), k), -1, dtype=np.int64),
            "images": np.zeros((len(cids), k, *shape), dtype=np.uint8),
            "truth": np.full((len(cids), k, *shape[1:]), -100, dtype=np.int16),
            "predicted": np.full((len(cids), k, *shape[1:]), -1, dtype=np.int16),
        }
        views = self.views.at(rnd)
        for i, cid in enumerate(cids):
            view, n = views[cid], len(predicted[cid])
            index = view.eval_index[:n]
            _, truth = self.dataset.batch(view.eval_split, index, view.labels)
            out["index"][i, :n] = index.cpu().numpy()
            out["images"][i, :n] = view.eval_split.x[index].cpu().numpy()
            out["truth"][i, :n] = truth.cpu().numpy()
            out["predicted"][i, :n] = predicted[cid].numpy()
        return out

    def _similarity(self, models: dict[int, torch.Tensor]) -> dict[str, Any]:
        """FedAC's Fig. 2 matrices of the clients that answered (:mod:`fedtail.metrics.similarity`)."""
        cids = sorted(models)
        y = self.dataset.train.labels  # segmentation: each image's primary class
        C = self.partition.num_classes
        counts = np.stack([np.bincount(y[self.partition.clients[c].train], minlength=C) for c in cids])
        return {"clients": cids} | client_similarity(torch.stack([models[c] for c in cids]), counts)

    def _named_metrics(self, counts: StageCounts, main: StageCounts, participants: list[int]) -> dict[str, Any]:
        """The personalised metrics of one named accuracy (and its A_local, A_part in stage runs)."""
        metrics = personalized_metrics(counts.correct, main.total, self.groups)
        out = {k: metrics[k] for k in NAMED_KEYS if k in metrics}
        if self.config.plan.has_stages:
            out |= local_metrics(counts, participants)
        return out

    def _global_seen_counts(self, rnd: int, model) -> StageCounts:
        """Counts of the global model on each client's seen-stage evaluation data (per stage too)."""
        views = self.views.at(rnd)
        C = self.dataset.num_classes
        parts = [
            evaluate(model, self.dataset, v.eval_split, v.eval_index, C, groups=v.eval_groups,
                     num_groups=len(v.classes_by_stage))
            for v in views
        ]  # fmt: skip
        return StageCounts(*(np.stack([getattr(p, k).numpy() for p in parts])
                             for k in ("correct", "total", "by_stage_correct", "by_stage_total")))  # fmt: skip
