"""Where client work runs: in this process (serial) or in a pool of worker processes.

Every client task is seeded from (run seed, round, call, client id) only, and every process
runs with the same number of intra-op threads, so the worker count never changes a result:
``--workers 4`` reproduces ``--workers 1`` bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from types import MappingProxyType
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch
import torch.multiprocessing as mp

from fedtail import components
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.config import RunConfig
from fedtail.data.base import Dataset
from fedtail.engine.context import ClientContext, ClientData, Workspace, derive_seed, eval_message, load_weights
from fedtail.engine.device import configure, resolve, to_device, to_host, worker_device
from fedtail.engine.guard import ClientGuard, outgoing
from fedtail.partition import Partition


@dataclass
class Task:
    cid: int
    rnd: int
    call: int  # index of the exchange within the round (a round may exchange several times)
    message: Message
    state: dict[str, Any]
    read_only: bool = False  # evaluation: the client may read its state but not change it


@dataclass
class Result:
    cid: int
    reply: Message
    state: dict[str, Any] | None  # None: the state stays where the client ran (a Flower node)
    seconds: float
    state_nonfinite: str | None = None  # where a state kept elsewhere holds NaN / inf (checked there)
    # evaluation of a method without personal models, with stage tasks: the counts of the client's
    # latest locally trained model (None: it has none yet, its local model is the one it is sent)
    local: Message | None = None


# ctx.state key where the engine keeps the latest upload of a client of a method without a
# personalised model (Algorithm.personal_model = False), in stage runs: its local model for A_local
LOCAL_MODEL = "engine.local_model"


def _seen(parts: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted concatenation of per-stage index arrays, and the stage of each entry."""
    idx = np.concatenate(parts)
    stage = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    order = np.argsort(idx, kind="stable")
    return _index(idx[order], device), _index(stage[order], device)


def _index(rows: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.int64, device=device)


def client_views(
    partition: Partition, dataset: Dataset, eval_split: str, stage: int | None = None, seen: int | None = None
) -> list[ClientData]:
    """Index tensors of every client, on the dataset's device.

    ``stage`` m (stage tasks only): training data of stage m; test and validation data of the
    stages 0..``seen`` − 1 (default m + 1), with the stage of each evaluation sample. ``None``:
    each client's whole data.
    """
    test_split = dataset.test if partition.test_source == "test" else dataset.train
    device = dataset.device
    views = []
    for client in partition.clients:
        groups = None
        if stage is None:
            train = _index(client.train, device)
            test = _index(client.test, device)
            val = _index(client.val, device)
            classes: tuple[torch.Tensor, ...] = ()
        else:
            shown = client.stages[: stage + 1 if seen is None else seen]
            train = _index(client.stages[stage].train, device)
            test, test_groups = _seen([s.test for s in shown], device)
            val, val_groups = _seen([s.val for s in shown], device)
            groups = val_groups if eval_split == "val" else test_groups
            classes = tuple(_index(s.classes, device) for s in shown)
        if eval_split == "val":
            split, index = dataset.train, val
        else:
            split, index = test_split, test
        labels = dataset.label_table(client.classes) if client.classes is not None else None
        views.append(ClientData(train, test, val, test_split, split, index, stage or 0, classes, groups, labels))
    return views


class Views:
    """Every client's data views as round ``rnd`` needs them (built once per (stage, seen stages)).

    Without stage tasks, the whole clients in every round. With stage tasks, the training data of
    the round's stage and the evaluation data of the stages trained so far
    (``config.plan.stage_of`` / ``config.plan.seen_stages``): M views with blocks, 2M − 1 with nested stages.
    """

    def __init__(self, config: RunConfig, partition: Partition, dataset: Dataset) -> None:
        self.config, self.partition, self.dataset = config, partition, dataset
        self._cache: dict[tuple[int, int] | None, list[ClientData]] = {}

    def at(self, rnd: int) -> list[ClientData]:
        config = self.config
        key = (config.plan.stage_of(rnd), config.plan.seen_stages(rnd)) if config.plan.has_stages else None
        if key not in self._cache:
            stage, seen = key if key is not None else (None, None)
            self._cache[key] = client_views(self.partition, self.dataset, config.eval_split, stage, seen)
        return self._cache[key]


class ClientRuntime:
    """Runs client tasks in one process: the workspace, the views and the client half, on ``device``
    (default: the run's). A task's message and state go to the device before the client half runs,
    its reply and new state come back to the CPU (:mod:`fedtail.engine.device`)."""

    def __init__(
        self, config: RunConfig, dataset: Dataset, partition: Partition, device: torch.device | None = None
    ) -> None:
        torch.set_num_threads(config.threads)
        self.config = config
        self.device = resolve(config.device) if device is None else device
        configure(self.device, config.deterministic)
        self.workspace = Workspace(config, dataset, self.device)
        self.views = Views(config, partition, self.workspace.dataset)
        spec = components.algorithm(config.algorithm)
        self.client: ClientHalf = spec.client()
        self.options = components.algorithm_options(config)
        self.keeps_local = config.plan.has_stages and not spec.personal_model
        self.finetune = config.finetune if config.finetune.active else None  # before every evaluation
        self.guard = ClientGuard.of(config)  # DP clipping, hostile clients (fedtail.engine.guard)

    def run(self, task: Task) -> Result:
        start = time.perf_counter()
        seed = derive_seed(self.config.seed, task.rnd, task.call, task.cid)
        torch.manual_seed(seed)  # for any module-level randomness (dropout layers)
        state = to_device(task.state, self.device)
        ctx = ClientContext(
            cid=task.cid,
            rnd=task.rnd,
            seed=seed,
            data=self.views.at(task.rnd)[task.cid],
            workspace=self.workspace,
            options=self.options,
            state=MappingProxyType(state) if task.read_only else state,  # type: ignore[arg-type]
            finetune=self.finetune if task.read_only else None,
            capture_model=task.read_only and task.rnd in self.config.similarity_rounds,
            capture_masks=self.config.sample_masks if task.read_only and task.rnd == self.config.rounds else 0,
        )
        reply = to_host(self.client.handle(to_device(task.message, self.device), ctx))
        local = None
        if self.keeps_local:
            local = to_host(self._local_model(task, ctx, reply))
        if not task.read_only:  # what the client sends: clipped under DP, corrupted by a hostile client
            reply = outgoing(self.config, task.cid, seed, task.message, reply, self.guard)
        state = {} if task.read_only else to_host(ctx.state)  # nothing to send back from an evaluation
        return Result(task.cid, reply, state, time.perf_counter() - start, local=local)

    def _local_model(self, task: Task, ctx: ClientContext, reply: Message) -> Message | None:
        """Keep a fit's upload as the client's local model; evaluate it at an evaluation."""
        keys = self.workspace.model().state_dict().keys()
        if not task.read_only:
            if task.message.kind == "fit" and keys <= reply.tensors.keys():
                ctx.state[LOCAL_MODEL] = {k: reply.tensors[k].clone() for k in keys}
            return None
        if LOCAL_MODEL not in ctx.state:
            return None
        model = self.workspace.model(LOCAL_MODEL)
        load_weights(model, ctx.state[LOCAL_MODEL])
        return eval_message(ctx.count(model))


class SerialExecutor:
    """Runs tasks one after another in this process."""

    def __init__(self, runtime: ClientRuntime) -> None:
        self.runtime = runtime

    def map(self, tasks: Iterable[Task]) -> Iterator[Result]:
        for task in tasks:  # taken one at a time: the engine may hand a generator (Simulation.lazily)
            if not task.read_only:
                # A copy, as the process pool's pickling makes one: a client half that changes its
                # state in place must not change the engine's copy before the reply is accepted
                # (a rejected or lost reply leaves the client's state as it was).
                task = dataclasses.replace(task, state=copy.deepcopy(task.state))
            yield self.runtime.run(task)

    def commit(self, cid: int) -> None:
        """The engine accepted client ``cid``'s latest reply (its state is in the Result: nothing to do)."""

    def close(self) -> None:
        pass


_RUNTIME: ClientRuntime | None = None


def _init_worker(config: RunConfig, dataset: Dataset, partition: Partition, counter: Any) -> None:
    global _RUNTIME
    with counter.get_lock():  # this worker's number, for spreading workers over several GPUs
        worker = counter.value
        counter.value += 1
    device = worker_device(resolve(config.device), config.device, worker)
    _RUNTIME = ClientRuntime(config, dataset, partition, device)


def _run_task(task: Task) -> Result:
    assert _RUNTIME is not None, "worker not initialised"
    return _RUNTIME.run(task)


class ProcessExecutor:
    """A pool of spawned worker processes, each with its own runtime and one task at a time.

    The dataset tensors go to the workers through shared memory (torch.multiprocessing), so
    the pool costs one copy of the data in total, not one per worker. On a GPU every worker moves
    them to its device (one copy each there): several workers share one GPU (``--workers W``
    with ``--device cuda:N``), or are spread over all of them (``cuda`` or ``auto``).
    """

    def __init__(self, config: RunConfig, dataset: Dataset, partition: Partition) -> None:
        dataset = dataset.to("cpu")  # the pool's copy is the host's, in shared memory
        for split in (dataset.train, dataset.test):
            split.x.share_memory_()
            split.y.share_memory_()
        ctx = mp.get_context("spawn")
        counter = ctx.Value("i", 0)
        self.pool = ctx.Pool(
            config.workers, initializer=_init_worker, initargs=(config, dataset, partition, counter)
        )

    def map(self, tasks: list[Task]) -> Iterator[Result]:
        # imap keeps task order; chunksize 1 balances clients of unequal size across workers
        return self.pool.imap(_run_task, tasks, chunksize=1)

    def commit(self, cid: int) -> None:
        """The engine accepted client ``cid``'s latest reply (its state is in the Result: nothing to do)."""

    def close(self) -> None:
        self.pool.close()
        self.pool.join()

    def terminate(self) -> None:
        self.pool.terminate()
        self.pool.join()


def make_executor(config: RunConfig, dataset: Dataset, partition: Partition, runtime: ClientRuntime | None = None):
    if config.workers == 1:
        return SerialExecutor(runtime or ClientRuntime(config, dataset, partition))
    return ProcessExecutor(config, dataset, partition)
