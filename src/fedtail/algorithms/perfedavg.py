"""Per-FedAvg: Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach.

Fallah, Mokhtari and Ozdaglar, NeurIPS 2020 (Algorithm 1). The federation learns an initial
model w that each client adapts with one gradient step, F_i(w) = f_i(w − α∇f_i(w)). Client i,
given w^t, runs τ local steps; each draws independent batches D, D' (and D'' for HF) of its data:

    w̃ = w − α · ∇f_i(w; D)                                   (the personalisation step)
    FO:  w ← w − β · ∇f_i(w̃; D')
    HF:  w ← w − β · (I − α · ∇²f_i(w; D'')) · ∇f_i(w̃; D')

FO drops the Hessian term of the MAML gradient (I − α∇²f_i(w)) ∇f_i(w̃); HF keeps it through a
Hessian-vector product. The server aggregates like FedAvg, w^{t+1} = Σ_{i∈S_t} (n_i/n_S) · w_i.
Personalised accuracy: each client takes plain gradient steps of size α from the global model
on batches of its training data and is evaluated with the result; the global test split sees
the plain global model. That is the engine's fine-tuning before evaluation, which Per-FedAvg gets
from its reference settings (``--finetune-steps 1 --finetune-optimizer plain``,
:class:`fedtail.config.FinetuneConfig`): it draws from the evaluation task's own random stream
and changes no client state. Its step size is α (``alpha``, else the run's lr at the round)
unless ``--finetune-lr`` sets one.

How the reference code runs it. FedReMa's released code (built on PFLlib, TsingZ0/PFLlib) holds
FedReMa alone, so PFLlib's implementations stand for its baselines (*interpretation*). PFLlib's
Per-FedAvg client (FO, commit 487a29e) cuts each shuffled epoch into batches of 2B samples,
dropping the incomplete last one, and takes one meta-step per such batch with D its first B
samples and D' its last B, for E epochs; its server runs that training twice per round; β is
the local learning rate, set once when the client is built, α the optimizer's (the same lr); the
optimizer is plain SGD (no momentum, no clipping); evaluation follows one SGD step of size α on
one training batch (``finetune.steps = 1``). At FedReMa's protocol (480 training samples, B = 100,
E = 5) that is 2 · 5 · ⌊480/200⌋ = 20 meta-steps of β = 0.01 per round. These are the
algorithm's reference settings (``steps = "pfllib"``, ``beta = null``), which a run gets unless
it sets the options. The option defaults (β = 0.001, the outer step size of the Per-FedAvg
paper's experiments, and ``steps = "epochs"``) are what runs made before the reference settings
existed used, and what a stored config without these keys means.

Options and *interpretations*:

- ``variant`` = "fo": HF costs a third batch and a double backward per step (about twice FO's
  compute) for the paper's small gain over FO; PFLlib runs FO; FedReMa does not say which.
- HF computes ∇²f_i(w; D'') · v exactly, by double backward (a Hessian-vector product, never
  the Hessian), where the paper approximates it by the finite difference
  (∇f_i(w + δv; D'') − ∇f_i(w − δv; D''))/(2δ): the same quantity without δ to choose.
- ``alpha`` = null: the run's learning rate at the round (FedReMa trains every method with
  η = 0.01; α is the step that adapts the model, in training and at evaluation alike).
- ``beta``: the outer step size; null is the run's --lr, undecayed (PFLlib's β = lr, set once).
- ``steps``, the local meta-steps of a round, each on k = 2 (FO) or 3 (HF) batches of B samples:
  "pfllib": two passes of E epochs; each epoch is shuffled and cut into chunks of k·B samples,
  the incomplete last chunk dropped (a client with fewer than k·B samples uses all of them as
  its one chunk, where PFLlib would take no step), and each chunk, split into k consecutive
  parts, is one step: τ = 2 · E · max(1, ⌊n_i / (k·B)⌋), the batches of a step disjoint.
  "epochs": the run's E epochs of batches consumed k per step, τ = max(1, ⌊E · ⌈n_i/B⌉ / k⌋),
  so a round reads E epochs of data as FedAvg does; the batches of one step are consecutive
  batches of the shuffled data (they may share samples when a step spans two epochs, and are
  the whole data when n_i ≤ B; the paper draws them independently).
  With --local-steps N, τ = N steps of either kind (the paper's τ).
- the inner step is plain gradient descent; the outer step is the run's SGD (momentum, weight
  decay, gradient clipping) with learning rate β; the reference settings are plain SGD.
- the reported training loss averages the cross-entropy of every forward pass (at w on D and
  D'', at w̃ on D'); the sample count counts every batch read.
- BatchNorm running statistics (ResNet) follow every forward pass in training mode, including
  the one at w̃.
- configs stored when the adaptation was the option ``eval_steps`` (default 1) are read as the
  engine setting, steps of plain SGD at α (:func:`migrate`).

Missing replies (``--dropout``, rejected replies): the server is FedAvg's: the mean of the replies
that arrived.

- Model split: none (the whole model is meta-learned and averaged).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Literal

import torch
from pydantic import Field
from torch.func import functional_call

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, ClientHalf, Message, Reference, cross_entropy, shuffled
from fedtail.algorithms.fedavg import FedAvgServer

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext

Batch = tuple[torch.Tensor, torch.Tensor]


class PerFedAvgConfig(AlgorithmConfig):
    variant: Literal["fo", "hf"] = Field("fo", description="fo: first-order; hf: with the Hessian-vector product")
    alpha: float | None = Field(None, gt=0, description="α: personalisation step size (null: the run's --lr)")
    beta: float | None = Field(
        0.001, gt=0, description="β: step size of the meta update (null: the run's --lr, PFLlib's reference)"
    )
    steps: Literal["pfllib", "epochs"] = Field(
        "epochs",
        description="meta-steps per round: pfllib (2 passes of E epochs, one step per k·B-sample chunk: the "
        "reference) or epochs (E epochs of batches shared out k per step)",
    )


PFLLIB_PASSES = 2  # PFLlib's Per-FedAvg server trains each selected client twice a round


def shuffled_batches(index: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of endless epochs, each reshuffled."""
    while True:
        yield from shuffled(index, generator).split(batch_size)


def full_chunks(index: torch.Tensor, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Chunks of ``size`` indices of endless reshuffled epochs, each epoch's incomplete last chunk
    dropped (PFLlib's ``drop_last``); an index shorter than ``size`` is one chunk per epoch."""
    while True:
        order = shuffled(index, generator)
        full = len(order) // size
        yield from order[: full * size].split(size) if full else (order,)


def step_batches(ctx: ClientContext, k: int, steps: str) -> Iterator[list[torch.Tensor]]:
    """The index batches (D, D'[, D'']) of each of the round's meta-steps, by the ``steps`` rule."""
    cfg = ctx.train_config
    if steps == "epochs":
        stream = shuffled_batches(ctx.data.train, cfg.batch_size, ctx.generator)
        for _ in range(local_steps(ctx, k)):
            yield [next(stream) for _ in range(k)]
        return
    chunks = full_chunks(ctx.data.train, k * cfg.batch_size, ctx.generator)
    if cfg.local_steps is not None:
        count = cfg.local_steps
    else:
        count = PFLLIB_PASSES * cfg.local_epochs * max(1, len(ctx.data.train) // (k * cfg.batch_size))
    for _ in range(count):
        yield list(torch.tensor_split(next(chunks), k))


def _loss(model: nn.Module, names: list[str], params, batch: Batch) -> torch.Tensor:
    x, y = batch
    return cross_entropy(functional_call(model, dict(zip(names, params)), (x,)), y)


def meta_gradient(
    model: nn.Module, batches: list[Batch], alpha: float, hessian: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The direction of one Per-FedAvg step at the model's parameters w, and each pass's loss.

    FO: ∇f(w̃; D') with w̃ = w − α∇f(w; D). HF: (I − α∇²f(w; D''))∇f(w̃; D'), the product
    taken by double backward. ``batches`` are D, D' (and D''). The model is not changed.
    """
    names, w = zip(*model.named_parameters())
    names = list(names)
    loss_w = _loss(model, names, w, batches[0])
    g_w = torch.autograd.grad(loss_w, w)
    adapted = [(p.detach() - alpha * g).requires_grad_() for p, g in zip(w, g_w)]
    loss_adapted = _loss(model, names, adapted, batches[1])
    direction = list(torch.autograd.grad(loss_adapted, adapted))
    losses = [loss_w.detach(), loss_adapted.detach()]
    if hessian:
        loss_h = _loss(model, names, w, batches[2])
        g_h = torch.autograd.grad(loss_h, w, create_graph=True)
        # d/dw ⟨∇f(w; D''), v⟩ = ∇²f(w; D'') v, with v = the direction held constant
        hv = torch.autograd.grad(g_h, w, grad_outputs=direction)
        direction = [d - alpha * h for d, h in zip(direction, hv)]
        losses.append(loss_h.detach())
    return direction, losses


def migrate(config: dict[str, Any]) -> dict[str, Any]:
    """A config stored when the adaptation before evaluation was the option ``eval_steps``
    (default 1: plain SGD steps of size α) as the engine's ``finetune``; today's configs unchanged."""
    options = dict(config.get("options") or {})
    if "eval_steps" not in options:
        return config
    from fedtail.config import FinetuneConfig

    steps = options.pop("eval_steps", 1)
    out = {k: v for k, v in config.items() if k != "finetune"} | {"options": options}
    if steps:
        out["finetune"] = FinetuneConfig(steps=steps, optimizer="plain").model_dump(mode="json")
    return out


def local_steps(ctx: ClientContext, batches_per_step: int) -> int:
    """τ: --local-steps if set, else as many steps as the run's epochs have batches to share out."""
    cfg = ctx.train_config
    if cfg.local_steps is not None:
        return cfg.local_steps
    per_epoch = math.ceil(len(ctx.data.train) / cfg.batch_size)
    return max(1, cfg.local_epochs * per_epoch // batches_per_step)


class PerFedAvgClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: PerFedAvgConfig = ctx.options
        model = ctx.load(msg.tensors)
        if len(ctx.data.train) == 0:
            return ctx.reply(ctx.weights())
        model.train()
        hessian = opts.variant == "hf"
        k = 3 if hessian else 2
        alpha = ctx.lr if opts.alpha is None else opts.alpha
        beta = ctx.train_config.lr if opts.beta is None else opts.beta  # PFLlib: β = the lr, set once
        params = list(model.parameters())
        optimizer = ctx.optimizer(params, lr=beta)
        clip = ctx.train_config.grad_clip
        # summed on the device in float64 (as the host's sum of float(loss) * n), read once at the end
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        for indices in step_batches(ctx, k, opts.steps):
            batches = [ctx.dataset.batch(ctx.dataset.train, index, ctx.data.labels) for index in indices]
            direction, losses = meta_gradient(model, batches, alpha, hessian)
            for p, d in zip(params, direction):
                p.grad = d
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            for loss, (_, y) in zip(losses, batches):
                loss_sum += loss.detach().double() * len(y)
                ctx.stats.samples += len(y)
            ctx.stats.steps += 1
        ctx.stats.loss_sum = ctx.stats.loss_sum + loss_sum
        optimizer.zero_grad(set_to_none=True)
        return ctx.reply(ctx.weights())

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        opts: PerFedAvgConfig = ctx.options
        if opts.alpha is not None and ctx.finetune is not None and ctx.finetune.lr is None:
            ctx.finetune = ctx.finetune.model_copy(update={"lr": opts.alpha})  # α adapts at evaluation too
        ctx.load(msg.tensors)
        return ctx.evaluate()  # adapted first by the engine (--finetune-*)


PERFEDAVG = Algorithm(
    name="perfedavg",
    summary="Per-FedAvg (Fallah et al. 2020): MAML-style local steps (FO or HF), SGD adaptation before evaluation",
    server=FedAvgServer,
    client=PerFedAvgClient,
    config=PerFedAvgConfig,
    reference=Reference(PFLLIB, options={"beta": None, "steps": "pfllib"}, finetune={"steps": 1, "optimizer": "plain"}),
    migrate=migrate,
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
