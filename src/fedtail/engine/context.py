"""What the engine hands to algorithm halves: data views, a reusable model workspace, state.

A :class:`Workspace` lives once per process (main or worker). Its models and optimizers are
built once and reused for every client: loading a client's weights is an in-place copy, and
an optimizer is reset, not rebuilt. This is what keeps per-client cost at the cost of training.

Its models, its dataset and the clients' index views are on the run's compute device
(``ctx.device``); what a half receives in a message and keeps in ``ctx.state`` is moved there by the
engine, and what it returns is moved back (:mod:`fedtail.engine.device`). A tensor a half creates
itself names its device: ``torch.zeros(n, device=ctx.device)``, or ``like.new_zeros(n)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

import numpy as np
import torch
from torch import nn

from fedtail import wire
from fedtail.algorithms.base import AlgorithmConfig, Message, Tensors
from fedtail.config import FinetuneConfig, RunConfig, TrainConfig
from fedtail.engine.device import to_device
from fedtail.data.base import Dataset, Split
from fedtail.engine.training import (
    EvalCounts,
    Predict,
    StepHook,
    TrainStats,
    evaluate,
    train_epochs,
)
from fedtail.components import build_model
from fedtail.models import SplitModel
from fedtail.partition import Partition


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys; the same keys give the same seed in any process.

    The keys are ``SeedSequence`` entropy, in which trailing zeros do not count: ``(s, a, b)`` and
    ``(s, a, b, 0)`` give one seed, so a fixed key can meet a task's ``(seed, round, call, client 0)``
    (round r's DP noise in the simulator, key 0xD9, is client 0's task seed at round 217, call r).
    The streams that meet feed unrelated draws; the keys stay, since new ones would change every
    committed result.
    """
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def initial_weights(config: RunConfig, dataset: Dataset) -> Tensors:
    """The common starting model of a run, identical in every process."""
    # Drawn on the CPU whatever the compute device, so that every device starts from the same model.
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # leave the caller's random stream untouched
        torch.manual_seed(derive_seed(config.seed, 0xC0FFEE))
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.head)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Workspace:
    """Per-process reusable models and optimizers, keyed by role name ("main", "personal", ...), on
    ``device`` (default: the CPU), with ``dataset`` moved there."""

    def __init__(self, config: RunConfig, dataset: Dataset, device: torch.device | None = None) -> None:
        self.config = config
        self.device = torch.device("cpu") if device is None else device
        self.dataset = dataset.to(self.device)
        self._models: dict[str, SplitModel] = {}
        self._optimizers: dict[tuple[str, tuple[int, ...]], torch.optim.SGD] = {}
        self._init_weights: Tensors | None = None

    @property
    def init_weights(self) -> Tensors:
        """The run's common initial model, on the workspace's device (computed once per process)."""
        if self._init_weights is None:
            self._init_weights = to_device(initial_weights(self.config, self.dataset), self.device)
        return self._init_weights

    def model(self, role: str = "main") -> SplitModel:
        if role not in self._models:
            # Workspace weights are always overwritten before use; building must not consume
            # the task's random stream, or results would depend on which process built it. Built
            # on the CPU (whose stream is forked) and then moved, so no device stream is touched.
            with torch.random.fork_rng(devices=[]), torch.device("cpu"):
                cfg, data = self.config, self.dataset
                model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.head)
            model = model.to(self.device)
            self._models[role] = model.to_channels_last() if self.config.channels_last else model
        return self._models[role]

    def optimizer(
        self, params: Iterable[nn.Parameter], lr: float, role: str = "main", **hyper: float
    ) -> torch.optim.SGD:
        """An SGD optimizer over ``params`` with fresh state (momentum buffers cleared)."""
        params = list(params)
        key = (role, tuple(id(p) for p in params))
        opt = self._optimizers.get(key)
        train = self.config.train
        settings = {"momentum": train.momentum, "weight_decay": train.weight_decay} | hyper
        if opt is None:
            opt = torch.optim.SGD(params, lr=lr, **settings)
            self._optimizers[key] = opt
        else:
            opt.state.clear()
            for group in opt.param_groups:
                group.update(lr=lr, **settings)
        return opt


def load_weights(model: nn.Module, tensors: Tensors, strict: bool = True) -> None:
    """Copy named tensors into ``model`` in place (no reallocation)."""
    own = model.state_dict(keep_vars=True)
    if strict and tensors.keys() != own.keys():
        missing = sorted(own.keys() - tensors.keys())[:3]
        extra = sorted(tensors.keys() - own.keys())[:3]
        raise KeyError(f"weights do not match the model: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, value in tensors.items():
            own[name].copy_(value)


def get_weights(model: nn.Module, keys: Iterable[str] | None = None) -> Tensors:
    """Detached copies of the model's named tensors (all, or only ``keys``)."""
    state = model.state_dict()
    names = state.keys() if keys is None else keys
    return {k: state[k].detach().clone() for k in names}


@dataclass
class ClientData:
    """Index views of one client's data (into the dataset's train/test splits).

    With stage tasks (``--partition stages``) this is the view of one round: ``train`` holds the
    round's stage m training samples only (the other stages' samples are not there: no replay),
    ``test`` and ``val`` (and so ``eval_index``) those of every stage trained so far (0..m with
    blocks; all M after the first round of global optimisation with nested stages),
    ``classes_by_stage`` the classes of those stages and ``eval_groups`` the stage of each
    evaluation sample. Without stages: the client's whole data, ``stage`` 0 and no stage classes.

    ``labels``: a segmentation client's label table (its own labelling, or None for the
    dataset's), which every batch of its data goes through.
    """

    train: torch.Tensor
    test: torch.Tensor
    val: torch.Tensor
    test_split: Split
    eval_split: Split
    eval_index: torch.Tensor
    stage: int = 0
    classes_by_stage: tuple[torch.Tensor, ...] = ()
    eval_groups: torch.Tensor | None = None  # with stages: the stage of each eval_index entry
    labels: torch.Tensor | None = None  # segmentation: the client's label table (Dataset.label_table)

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def stage_classes(self) -> torch.Tensor | None:
        """The classes of the current stage task (None without stages)."""
        return self.classes_by_stage[self.stage] if self.classes_by_stage else None

    @property
    def seen_classes(self) -> torch.Tensor | None:
        """The classes of every stage task trained so far, the current one included: sorted, each
        once (None without stages)."""
        return torch.cat(self.classes_by_stage).unique() if self.classes_by_stage else None

    @property
    def old_classes(self) -> torch.Tensor | None:
        """The classes of the other stage tasks trained so far (a class of the current task too,
        if it recurs), sorted, each once (None without stages)."""
        if not self.classes_by_stage:
            return None
        others = [c for k, c in enumerate(self.classes_by_stage) if k != self.stage]
        empty = torch.empty(0, dtype=torch.int64, device=self.train.device)
        return torch.cat((empty, *others)).unique()


@dataclass
class ClientContext:
    """Everything a client half may use while it answers one message."""

    cid: int
    rnd: int
    seed: int
    data: ClientData
    workspace: Workspace
    options: AlgorithmConfig
    state: dict[str, Any] = field(default_factory=dict)
    stats: TrainStats = field(default_factory=TrainStats)
    # evaluation tasks of a run with --finetune-*: what :meth:`evaluate` trains first (engine-set)
    finetune: FinetuneConfig | None = None
    # evaluation tasks of a --similarity-rounds round: the reply carries the scored model (engine-set)
    capture_model: bool = False
    # segmentation, the final evaluation of a run with --sample-masks K: the reply carries the
    # predicted masks of the first K evaluation images (engine-set)
    capture_masks: int = 0

    def __post_init__(self) -> None:
        # The client's random stream (shuffles, sampled features) stays on the CPU on every device:
        # draw with it there and move the result (torch.rand(..., generator=g).to(ctx.device)).
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)

    # -- shortcuts --------------------------------------------------------------------------
    @property
    def dataset(self) -> Dataset:
        return self.workspace.dataset

    @property
    def device(self) -> torch.device:
        """Where this client computes: its models, data and the tensors of ``msg`` and ``ctx.state``."""
        return self.workspace.device

    @property
    def stage(self) -> int:
        """The 0-based stage task of this round (always 0 without stages)."""
        return self.data.stage

    @property
    def train_config(self) -> TrainConfig:
        return self.workspace.config.train

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def lr(self) -> float:
        return self.train_config.lr_at(self.rnd)

    @property
    def init_weights(self) -> Tensors:
        return self.workspace.init_weights

    def model(self, role: str = "main") -> SplitModel:
        return self.workspace.model(role)

    def load(self, tensors: Tensors, role: str = "main", strict: bool = True) -> SplitModel:
        model = self.model(role)
        load_weights(model, tensors, strict=strict)
        return model

    def weights(self, role: str = "main", keys: Iterable[str] | None = None) -> Tensors:
        return get_weights(self.model(role), keys)

    def optimizer(self, params: Iterable[nn.Parameter], lr: float | None = None, role: str = "main", **hyper: float):
        return self.workspace.optimizer(params, self.lr if lr is None else lr, role=role, **hyper)

    # -- the two things nearly every client does --------------------------------------------
    def train(
        self,
        role: str = "main",
        *,
        epochs: int | None = None,
        lr: float | None = None,
        params: list[nn.Parameter] | None = None,
        index: torch.Tensor | None = None,
        hook: StepHook | None = None,
        **hyper: float,
    ) -> TrainStats:
        """Local SGD on this client's training data; the stats also accumulate in ``ctx.stats``.

        ``epochs=None`` means the run's setting: ``--local-steps`` batches if set, else
        ``--local-epochs`` epochs.

        ``hook`` (:class:`~fedtail.engine.training.StepHook`) is what the algorithm adds to each
        step: a loss term (``Term(fn)``, or ``FeatureTerm(fn)`` when it needs the body's output),
        work after each step, before each pass over the data.

        ``hyper`` overrides the optimizer settings (momentum, weight_decay) for this call.
        """
        old = sorted(set(hyper) & {"extra_loss", "feature_loss", "on_step", "on_epoch"})
        if old:
            raise TypeError(
                f"ctx.train({', '.join(old)}=...): these are one hook now, ctx.train(hook=...): Term(fn) for "
                "extra_loss, FeatureTerm(fn) for feature_loss, a StepHook subclass for on_step / on_epoch"
            )
        model = self.model(role)
        params = list(model.parameters()) if params is None else params
        optimizer = self.optimizer(params, lr, role=role, **hyper)
        cfg = self.train_config
        stats = train_epochs(
            model,
            optimizer,
            self.dataset,
            self.data.train if index is None else index,
            epochs=cfg.local_epochs if epochs is None else epochs,
            # --local-steps replaces the run's epochs, not epochs an algorithm asks for explicitly.
            steps=cfg.local_steps if epochs is None else None,
            batch_size=cfg.batch_size,
            generator=self.generator,
            grad_clip=cfg.grad_clip,
            params=params,
            hook=hook,
            labels=self.data.labels,
        )
        self.stats += stats
        return stats

    def evaluate(self, role: str = "main", predict: Predict | None = None, main: str | None = None) -> Message:
        """Per-class counts of a model on this client's evaluation data, as a reply message.

        ``predict`` (default: the model's forward) may return several named scores of one pass,
        e.g. ``{"gp": ..., "lp": ..., "head": ...}``: the reply then carries every name's counts
        (the engine reports each as a named accuracy) and ``main``'s as the headline.

        In an evaluation task of a run that fine-tunes before evaluation (``--finetune-*``,
        :class:`~fedtail.config.FinetuneConfig`) the model is fine-tuned first, in place: the
        workspace model, never the client's state. At a ``--similarity-rounds`` round the reply
        carries the scored model too (:data:`fedtail.wire.EVAL_MODEL`).
        """
        model = self.model(role)
        if self.finetune is not None:
            self._finetune(model, role)
        message = eval_message(self.count(model, predict, main))
        if self.capture_model:
            message.tensors[wire.EVAL_MODEL] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        if self.capture_masks and self.dataset.segmentation:
            message.tensors[wire.EVAL_MASKS] = predicted_masks(model, self.dataset, self.data, self.capture_masks)
        return message

    def _finetune(self, model: SplitModel, role: str) -> None:
        """The run's fine-tuning before evaluation: SGD on this client's training data, from the
        evaluation task's random stream, on the whole model or on the head with the body frozen
        (``requires_grad`` off, as FedRep's head epochs: no backward through it)."""
        ft = self.finetune
        assert ft is not None
        frozen = model.body if ft.params == "head" else None
        params = list((model.head if frozen is not None else model).parameters())
        plain = ft.optimizer == "plain"
        hyper = {"momentum": 0.0, "weight_decay": 0.0} if plain else {}
        optimizer = self.optimizer(params, ft.lr, role=role, **hyper)
        cfg = self.train_config
        if frozen is not None:
            frozen.requires_grad_(False)
        try:
            train_epochs(
                model, optimizer, self.dataset, self.data.train,
                epochs=ft.epochs, steps=ft.steps, batch_size=cfg.batch_size, generator=self.generator,
                grad_clip=None if plain else cfg.grad_clip, params=params, labels=self.data.labels,
            )  # fmt: skip
        finally:
            if frozen is not None:
                frozen.requires_grad_(True)

    def count(self, model: nn.Module, predict: Predict | None = None, main: str | None = None) -> EvalCounts:
        """:func:`~fedtail.engine.training.evaluate` of ``model`` on this client's evaluation data
        (per stage too, with stage tasks)."""
        data = self.data
        return evaluate(
            model, self.dataset, data.eval_split, data.eval_index, self.num_classes, predict=predict, main=main,
            groups=data.eval_groups, num_groups=len(data.classes_by_stage), labels=data.labels,
        )

    def train_loss(self, role: str = "main") -> float:
        """Mean cross-entropy of a model on this client's whole training data (inference mode).

        What IFCA-style clients use to pick the cluster model that fits their data best.
        """
        counts = evaluate(self.model(role), self.dataset, self.dataset.train, self.data.train, self.num_classes,
                          labels=self.data.labels)
        n = len(self.data.train)
        return counts.loss_sum / n if n else float("inf")

    def reply(self, tensors: Tensors | None = None, **metrics: float) -> Message:
        """A reply carrying ``tensors`` and this call's training totals (samples, loss, steps)."""
        base = self.stats.as_metrics() | {wire.NUM_EXAMPLES: float(self.data.num_train)}
        return Message(kind="reply", tensors=tensors or {}, metrics=base | metrics)


def predicted_masks(model: nn.Module, dataset: Dataset, data: ClientData, k: int) -> torch.Tensor:
    """The (k, H, W) uint8 argmax masks of ``model`` for the first ``k`` evaluation images of ``data``."""
    index = data.eval_index[:k]
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        x, _ = dataset.batch(data.eval_split, index, data.labels)
        masks = model(x).argmax(dim=1).to(torch.uint8) if len(index) else torch.empty(0, *dataset.input_shape[1:], dtype=torch.uint8)
    model.train(was_training)
    return masks


def eval_message(counts: EvalCounts) -> Message:
    """The evaluation reply: its counts under :mod:`fedtail.wire`'s names (per class; per named
    prediction; with stage tasks per seen stage too)."""
    staged = counts.by_stage_correct is not None and counts.by_stage_total is not None
    by_stage = (counts.by_stage_correct, counts.by_stage_total) if staged else None
    tensors = wire.eval_tensors(counts.correct, counts.total, counts.named, by_stage, counts.named_by_stage)
    if counts.confusion is not None:
        tensors[wire.CONFUSION] = counts.confusion
    return Message(kind="eval", tensors=tensors, metrics={"loss_sum": counts.loss_sum})


@dataclass
class ServerData:
    """Index views of the data the server holds (FEDIC), into ``split`` (the train split).

    ``labelled``: a class-balanced labelled set (``--set partition.server_samples_per_class``);
    ``unlabelled``: samples whose labels the algorithm must not use
    (``--set partition.server_unlabelled``). Both empty unless configured; batches come from
    ``dataset.batch(split, index)`` like every other data access.
    """

    labelled: torch.Tensor
    unlabelled: torch.Tensor
    split: Split


@dataclass
class ServerContext:
    """What a server (or edge) half may use: run settings, client sizes, a model workspace, and
    the samples the server holds itself (``server_data``, FEDIC's proxy data).

    With stage tasks, ``stage`` is the current round's stage (the engine calls
    :meth:`set_stage` before each round) and ``client_train_sizes`` that stage's training sizes.
    """

    config: RunConfig
    options: AlgorithmConfig
    workspace: Workspace
    partition: Partition
    client_train_sizes: np.ndarray
    init_weights: Tensors
    edge_of: np.ndarray  # client id -> edge id
    stage: int = 0

    def set_stage(self, stage: int) -> None:
        self.stage = stage
        if self.config.plan.has_stages:
            self.client_train_sizes = np.array([len(c.stages[stage].train) for c in self.partition.clients])

    def stage_of(self, rnd: int) -> int:
        """The 0-based stage task of round ``rnd``."""
        return self.config.plan.stage_of(rnd)

    @property
    def num_clients(self) -> int:
        return len(self.client_train_sizes)

    @property
    def device(self) -> torch.device:
        """The compute device of the server's models and data. Replies arrive on the CPU and the
        server's state stays there between rounds (checkpoints are device-neutral): a server half
        that computes with its models moves what it needs here and its results back."""
        return self.workspace.device

    @property
    def dataset(self) -> Dataset:
        return self.workspace.dataset

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @cached_property
    def server_data(self) -> ServerData:
        """The server's own samples (empty index tensors when the run configures none)."""
        held = self.partition.server
        index = lambda rows: torch.as_tensor([] if held is None else rows, dtype=torch.int64, device=self.device)  # noqa: E731
        return ServerData(
            labelled=index(None if held is None else held.labelled),
            unlabelled=index(None if held is None else held.unlabelled),
            split=self.dataset.train,
        )

    def model(self, role: str = "server") -> SplitModel:
        return self.workspace.model(role)

    def seed(self, *keys: int) -> int:
        return derive_seed(self.config.seed, 0x5E4, *keys)
