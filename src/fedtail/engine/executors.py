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
from typing import Any, Iterator

import numpy as np
import torch
import torch.multiprocessing as mp

from fedtail import components
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.config import RunConfig
from fedtail.data.base import Dataset
from fedtail.engine.context import ClientContext, ClientData, Workspace, derive_seed
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


def _seen(parts: list[np.ndarray]) -> torch.Tensor:
    return torch.as_tensor(np.sort(np.concatenate(parts)), dtype=torch.int64)


def client_views(partition: Partition, dataset: Dataset, eval_split: str, stage: int | None = None) -> list[ClientData]:
    """Index tensors of every client, built once per process.

    ``stage`` m (stage tasks only): training data of stage m, test and validation data of
    stages 0..m. ``None``: each client's whole data.
    """
    test_split = dataset.test if partition.test_source == "test" else dataset.train
    views = []
    for client in partition.clients:
        if stage is None:
            train = torch.as_tensor(client.train, dtype=torch.int64)
            test = torch.as_tensor(client.test, dtype=torch.int64)
            val = torch.as_tensor(client.val, dtype=torch.int64)
            classes: tuple[torch.Tensor, ...] = ()
        else:
            seen = client.stages[: stage + 1]
            train = torch.as_tensor(client.stages[stage].train, dtype=torch.int64)
            test = _seen([s.test for s in seen])
            val = _seen([s.val for s in seen])
            classes = tuple(torch.as_tensor(s.classes, dtype=torch.int64) for s in seen)
        if eval_split == "val":
            split, index = dataset.train, val
        else:
            split, index = test_split, test
        views.append(ClientData(train, test, val, test_split, split, index, stage or 0, classes))
    return views


def stage_views(config: RunConfig, partition: Partition, dataset: Dataset) -> list[list[ClientData]]:
    """``[stage][client]`` views: one list per stage task (one list of whole clients without stages)."""
    if config.num_stages == 1:
        return [client_views(partition, dataset, config.eval_split)]
    return [client_views(partition, dataset, config.eval_split, m) for m in range(config.num_stages)]


class ClientRuntime:
    """Runs client tasks in one process: the workspace, the views and the client half."""

    def __init__(self, config: RunConfig, dataset: Dataset, partition: Partition) -> None:
        torch.set_num_threads(config.threads)
        self.config = config
        self.workspace = Workspace(config, dataset)
        self.stage_views = stage_views(config, partition, dataset)
        self.views = self.stage_views[0]  # the views of stage 0 (of the whole clients without stages)
        spec = components.algorithm(config.algorithm)
        self.client: ClientHalf = spec.client()
        self.options = components.algorithm_options(config)

    def run(self, task: Task) -> Result:
        start = time.perf_counter()
        seed = derive_seed(self.config.seed, task.rnd, task.call, task.cid)
        torch.manual_seed(seed)  # for any module-level randomness (dropout layers)
        ctx = ClientContext(
            cid=task.cid,
            rnd=task.rnd,
            seed=seed,
            data=self.stage_views[self.config.stage_of(task.rnd)][task.cid],
            workspace=self.workspace,
            options=self.options,
            state=MappingProxyType(task.state) if task.read_only else task.state,  # type: ignore[arg-type]
        )
        reply = self.client.handle(task.message, ctx)
        state = {} if task.read_only else ctx.state  # nothing to send back from an evaluation
        return Result(task.cid, reply, state, time.perf_counter() - start)


class SerialExecutor:
    """Runs tasks one after another in this process."""

    def __init__(self, runtime: ClientRuntime) -> None:
        self.runtime = runtime

    def map(self, tasks: list[Task]) -> Iterator[Result]:
        for task in tasks:
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


def _init_worker(config: RunConfig, dataset: Dataset, partition: Partition) -> None:
    global _RUNTIME
    _RUNTIME = ClientRuntime(config, dataset, partition)


def _run_task(task: Task) -> Result:
    assert _RUNTIME is not None, "worker not initialised"
    return _RUNTIME.run(task)


class ProcessExecutor:
    """A pool of spawned worker processes, each with its own runtime and one task at a time.

    The dataset tensors go to the workers through shared memory (torch.multiprocessing), so
    the pool costs one copy of the data in total, not one per worker.
    """

    def __init__(self, config: RunConfig, dataset: Dataset, partition: Partition) -> None:
        for split in (dataset.train, dataset.test):
            split.x.share_memory_()
            split.y.share_memory_()
        ctx = mp.get_context("spawn")
        self.pool = ctx.Pool(config.workers, initializer=_init_worker, initargs=(config, dataset, partition))

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
