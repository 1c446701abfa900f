"""The algorithm contract: a server half and a client half that exchange named payloads.

An algorithm never learns whether it runs in the simulator or on Flower. Its server half is
plain sequential code that calls ``comm.exchange`` (or ``comm.stream``) as often as a round
needs; its client half answers one :class:`Message` at a time, with the client's data, a
reusable model workspace and the client's persistent state handed in by the engine through a
:class:`ClientContext`. See ``docs/architecture.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Literal, Mapping, Protocol

import torch
from pydantic import BaseModel, ConfigDict

from fedtail.wire import NUM_EXAMPLES

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from torch import nn

    from fedtail.engine.context import ClientContext, ServerContext

Tensors = dict[str, torch.Tensor]
Scalar = int | float | str | bool


@dataclass
class Message:
    """One payload between server and client, in either direction.

    ``kind`` names the client method that handles it ("fit", "evaluate", or any name an
    algorithm defines); ``tensors`` are named tensors (weights, prototypes, gradients, maps);
    ``config`` is small instructions; ``metrics`` are numbers reported back.
    """

    kind: str = "fit"
    tensors: Tensors = field(default_factory=dict)
    config: dict[str, Scalar] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_examples(self) -> float:
        """A reply's training samples (``metrics[fedtail.wire.NUM_EXAMPLES]``, set by ``ctx.reply``):
        the weight of a sample-weighted mean."""
        try:
            return self.metrics[NUM_EXAMPLES]
        except KeyError:
            raise KeyError(f"a {self.kind!r} message without {NUM_EXAMPLES!r} (replies made by ctx.reply carry it)") from None

    @property
    def nbytes(self) -> int:
        """Bytes this message puts on the wire (tensor payloads only)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def shuffled(index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``index`` in a random order, on ``index``'s device; the order is drawn on ``generator``'s
    device (a client's or server's generator is on the CPU), so every compute device draws the
    same order from the same seed."""
    perm = torch.randperm(len(index), generator=generator, device=generator.device)
    return index[to_like(perm, index)]


def to_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (a small tensor drawn on the host) on ``like``'s device; to a GPU from pinned memory
    without waiting (a plain copy from the host would wait for the GPU's queued work)."""
    if like.device.type == "cuda" and value.device.type == "cpu":
        return value.pin_memory().to(like.device, non_blocking=True)
    return value.to(like.device)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy`` of per-sample logits, or of a segmentation model's (B, C, H, W) logits with
    every pixel a row (targets −100 ignored; the mean is over the pixels not ignored). The pixels go
    through the 1-D kernel: PyTorch's 2-D one has no deterministic CUDA version."""
    import torch.nn.functional as F

    if logits.dim() > 2:
        logits, y = logits.movedim(1, -1).reshape(-1, logits.shape[1]), y.reshape(-1)
    return F.cross_entropy(logits, y, reduction=reduction)


def class_counts(labels: torch.Tensor, num_classes: int, where: torch.Tensor | None = None) -> torch.Tensor:
    """How many of ``labels`` (values in 0..num_classes − 1) fall in each class, among those ``where``
    holds (a bool mask) if given: ``torch.bincount``'s counts, int64, without its read of the
    largest label (on a GPU a wait for the device, each call)."""
    hits = labels.unsqueeze(1) == torch.arange(num_classes, device=labels.device)
    if where is not None:
        hits &= where.unsqueeze(1)
    return hits.sum(0)


class Comm(Protocol):
    """What a server half can do during a round; provided by the engine (simulator or Flower)."""

    def exchange(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        """Send one message to each named client; return their replies keyed by client id."""
        ...

    def stream(self, messages: Mapping[int, Message]) -> Iterator[tuple[int, Message]]:
        """Like :meth:`exchange` but yields replies one at a time in client-id order,
        so a streaming aggregate never holds every client's model at once."""
        ...

    def exchange_via_edges(self, messages: Mapping[int, Message]) -> dict[int, dict[int, Message]]:
        """Send to clients; each edge server's half reduces its clients' replies; return
        ``{edge_id: {key: message}}`` as the edges forward them to the server."""
        ...

    def log(self, **values: Any) -> None:
        """Record JSON-serialisable per-round values (cluster assignments, kappa, ...)."""
        ...


class AlgorithmConfig(BaseModel):
    """Options of one algorithm, set with ``--set NAME.key=value``; subclasses add fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def check_run(self, num_clients: int) -> None:
        """Raise ``ConfigError`` for options that do not fit the run (e.g. more clusters than
        clients). Called when the run's config is built, so a sweep rejects it before any run."""


class ServerHalf:
    """Server side of an algorithm. Subclasses implement :meth:`run_round`."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        """Run communication round ``rnd`` (1-based) with the sampled ``clients``."""
        raise NotImplementedError

    def evaluation_message(self, cid: int) -> Message:
        """What client ``cid`` needs to evaluate its current model (default: the global model)."""
        weights = self.global_weights()
        return Message(kind="evaluate", tensors=weights or {})

    def global_weights(self) -> Tensors | None:
        """The global model's full state dict, or None where the method has no global model."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume after the current round, written to checkpoints.

        Plain data only (tensors, numbers, strings, lists, dicts, numpy arrays: see
        ``fedtail.engine.checkpoint``); override this and :meth:`load_state_dict` otherwise.
        """
        return {k: v for k, v in vars(self).items() if k != "ctx"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        vars(self).update(state)


class ClientHalf:
    """Client side of an algorithm: one method per message kind; stateless between calls.

    Anything a client must remember across rounds goes in ``ctx.state`` (a dict the engine
    keeps per client and hands back next time).
    """

    def handle(self, msg: Message, ctx: ClientContext) -> Message:
        method = getattr(self, msg.kind, None)
        if method is None or msg.kind.startswith("_"):
            raise ValueError(f"{type(self).__name__} cannot handle message kind {msg.kind!r}")
        return method(msg, ctx)

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        """Default: evaluate the weights in the message (the global model) on local test data."""
        if msg.tensors:
            ctx.load(msg.tensors)
        return ctx.evaluate()


class PersonalClient(ClientHalf):
    """A client half that keeps its own model in ``ctx.state["personal"]`` (Ditto, MuPFL, FedAC, ...).

    Evaluation uses that model; a client that has not trained yet is evaluated with
    :meth:`start`, by default the model in the message (the global or cluster model).
    """

    def start(self, msg: Message, ctx: ClientContext) -> Tensors:
        """The personal model before this client's first training."""
        return msg.tensors

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        ctx.load(ctx.state.get("personal", self.start(msg, ctx)))
        return ctx.evaluate()


class EdgeHalf:
    """Optional middle tier (edge servers between clients and the server, as in MuPFL's ACMU).

    ``reduce`` receives the replies of the clients assigned to one edge and returns what the
    edge forwards to the server, keyed as the algorithm likes (client ids, or one summary).
    """

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def reduce(self, edge_id: int, replies: dict[int, Message]) -> dict[int, Message]:
        return replies

    def state_dict(self) -> dict[str, Any]:
        """What an edge keeps across rounds (for checkpoints; nothing for a stateless edge)."""
        return {k: v for k, v in vars(self).items() if k != "ctx"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        vars(self).update(state)


# FedReMa's released code is built on PFLlib (TsingZ0/PFLlib) and holds FedReMa alone, so PFLlib's
# implementations stand for the baselines of its Table 1 (an interpretation; the paper names no
# baseline code). benchmarks/fedrema/README.md tabulates what each reference runs.
PFLLIB = "PFLlib"


@dataclass(frozen=True)
class Reference:
    """How an algorithm's reference code runs it: the settings a run gets unless it sets them.

    ``fedtail.components.build_config`` fills a run's unset ``head``, ``train.momentum``,
    ``train.weight_decay``, ``train.grad_clip``, the ``options`` and the ``finetune`` settings
    (fine-tuning before evaluation) named here, and writes them into ``config.json``;
    a stored config is read literally. The defaults (the model's own split, plain SGD without
    clipping, the option defaults) leave a run's config as it was before references existed.
    """

    source: str = ""  # where the settings come from (code, paper), shown by `fedtail list`
    head: Literal["last", "all-fc"] | None = None  # the body/head split (None: the model's own)
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # algorithm options unlike their defaults
    finetune: Mapping[str, Any] = field(default_factory=dict)  # fine-tuning before evaluation (RunConfig.finetune)

    def describe(self) -> str:
        """One line for ``fedtail list``, e.g. 'PFLlib: head last, momentum 0, grad clip none'."""
        parts = [
            f"head {self.head or 'as the model'}",
            f"momentum {self.momentum:g}",
            f"weight decay {self.weight_decay:g}",
            f"grad clip {'none' if self.grad_clip is None else f'{self.grad_clip:g}'}",
        ]
        parts += [f"finetune {k}={json.dumps(v)}" for k, v in self.finetune.items()]
        parts += [f"{k}={json.dumps(v)}" for k, v in self.options.items()]
        return f"{self.source or 'none declared (fedtail defaults)'}: " + ", ".join(parts)


@dataclass(frozen=True)
class Algorithm:
    """Registry entry: a name, a one-line summary, the classes making up the algorithm, and
    the settings its reference code runs it with (:class:`Reference`)."""

    name: str
    summary: str
    server: type[ServerHalf]
    client: type[ClientHalf]
    config: type[AlgorithmConfig] = AlgorithmConfig
    edge: type[EdgeHalf] | None = None
    reference: Reference = field(default_factory=Reference)
    # config.json of an older fedtail (a dict) -> today's form, for stored runs (see fedbabu.migrate)
    migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # False: every client is evaluated with the global model (FedAvg, FedProx, FEDIC, CReFF, ...),
    # the method has no personalised model; with stage tasks the engine then takes each client's
    # latest locally trained model (its last upload) as its local model for A_local
    # (fedtail.metrics.stages).
    personal_model: bool = True
    # the dataset tasks the method runs on (fedtail.data.base.Task): "segmentation" where its client
    # step is supervised training through ctx.train / ctx.evaluate on any SplitModel (the head a
    # per-pixel classifier), tested by one round each (tests/test_segmentation.py)
    tasks: tuple[str, ...] = ("classification",)
    # task -> why the method does not run it (for `fedtail list` and the error of a run that asks)
    why_not: Mapping[str, str] = field(default_factory=dict)
    # True: every WeightedMean of the server half's round averages the replies of one exchange with
    # the sampled clients, so --aggregate's robust rules apply (fedtail.algorithms.aggregate); a
    # string: why not (``fedtail list``, and the error of a run that asks); False: not declared
    robust: bool | str = False
    # "updates": the fit replies carry updates (FedNova's normalised d_i) under the names of the weights
    # sent, not models; a hostile client (--byzantine) then corrupts them as updates of zero
    uploads: Literal["models", "updates"] = "models"
    # True: every floating tensor a fit's reply uploads is an update of one the server sent, averaged
    # by WeightedMean, so client-level DP (--dp-clip, fedtail.engine.guard) clips and noises all of
    # it; a string: why not; False: not declared
    dp: bool | str = False
    registry: ClassVar[dict[str, "Algorithm"]] = {}

    def __post_init__(self) -> None:
        self.config(**self.reference.options)  # a reference option the config rejects fails at import
        Algorithm.registry[self.name] = self


# --- local training: what an algorithm adds to ctx.train's steps ---------------------------------

# loss(model, x, y, logits) -> tensor added to the cross-entropy (FedProx, Ditto, ...)
ExtraLoss = Callable[["nn.Module", torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# loss(model, x, y, logits, features) -> extra loss that also needs the body's output
# (MOON, FedProto, FedPAC): the loop runs body and head apart, so no second forward is needed
FeatureLoss = Callable[["nn.Module", torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class StepHook:
    """What an algorithm adds to the steps of local training (``ctx.train(hook=...)``).

    Override what you need; each method does nothing by default. Per pass over the data
    ``before_epoch(e)`` (e = 0, 1, ...: BAVD's per-epoch map), per batch ``loss(...)`` (a term added
    to the cross-entropy, or None) and, after the optimizer step, ``after_step(loss)`` with the
    batch's cross-entropy, a detached 0-dim tensor on the model's device (``float(loss)`` waits for
    the device). With ``features = True`` the loop runs the body and the head apart and hands
    ``loss`` the body's output (the model must be a :class:`~fedtail.models.SplitModel`); else
    ``features`` is None.
    """

    features: bool = False

    def before_epoch(self, epoch: int) -> None:
        """Before the first batch of pass ``epoch`` over the data."""

    def loss(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The term added to the batch's cross-entropy (None: nothing)."""
        return None

    def after_step(self, loss: torch.Tensor) -> None:
        """After the optimizer step, with the batch's cross-entropy."""


class Term(StepHook):
    """The hook that adds ``fn(model, x, y, logits)`` to every step's loss (``fn`` None: nothing)."""

    def __init__(self, fn: ExtraLoss | None) -> None:
        self.fn = fn

    def loss(self, model, x, y, logits, features):
        return None if self.fn is None else self.fn(model, x, y, logits)


class FeatureTerm(StepHook):
    """The hook that adds ``fn(model, x, y, logits, features)`` (``fn`` None: nothing, one forward)."""

    def __init__(self, fn: FeatureLoss | None) -> None:
        self.fn = fn
        self.features = fn is not None

    def loss(self, model, x, y, logits, features):
        return None if self.fn is None else self.fn(model, x, y, logits, features)


NO_HOOK = StepHook()
