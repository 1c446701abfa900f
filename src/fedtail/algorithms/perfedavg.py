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
Personalised accuracy: each client takes ``eval_steps`` SGD steps of size α from the global model
on batches of its training data and is evaluated with the result; the global test split sees
the plain global model. The adaptation draws from the evaluation task's own random stream and
changes no client state.

Defaults and *interpretations*:

- ``variant`` = "fo": HF costs a third batch and a double backward per step (about twice FO's
  compute) for the paper's small gain over FO; FedReMa does not say which version it ran.
- HF computes ∇²f_i(w; D'') · v exactly, by double backward (a Hessian-vector product, never
  the Hessian), where the paper approximates it by the finite difference
  (∇f_i(w + δv; D'') − ∇f_i(w − δv; D''))/(2δ): the same quantity without δ to choose.
- ``alpha`` = null: the run's learning rate (FedReMa trains every method with η = 0.01; α is the
  step that adapts the model, in training and at evaluation alike). ``beta`` = 0.001, the outer
  step size of the Per-FedAvg paper's experiments.
- local steps: the run's E epochs of batches, consumed two (FO) or three (HF) batches per step,
  τ = max(1, ⌊E · ⌈n_i/B⌉ / k⌋), so a round reads E epochs of data as FedAvg does; the batches of
  one step are consecutive batches of the shuffled data (they may share samples when a step
  spans two epochs, and are the whole data when n_i ≤ B; the paper draws them independently); with --local-steps N, τ = N steps (the paper's τ).
- the inner step is plain gradient descent; the outer step is the run's SGD (momentum, weight
  decay, gradient clipping) with learning rate β, plain SGD with the default settings.
- the reported training loss averages the cross-entropy of every forward pass (at w on D and
  D'', at w̃ on D'); the sample count counts every batch read.
- BatchNorm running statistics (ResNet) follow every forward pass in training mode, including
  the one at w̃.

Missing replies (``--dropout``, rejected replies): the server is FedAvg's: the mean of the replies
that arrived.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call

from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, Message
from fedtail.algorithms.fedavg import FedAvgServer

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext

Batch = tuple[torch.Tensor, torch.Tensor]


class PerFedAvgConfig(AlgorithmConfig):
    variant: Literal["fo", "hf"] = Field("fo", description="fo: first-order; hf: with the Hessian-vector product")
    alpha: float | None = Field(None, gt=0, description="α: personalisation step size (null: the run's --lr)")
    beta: float = Field(0.001, gt=0, description="β: step size of the meta update")
    eval_steps: int = Field(1, ge=0, description="SGD steps of size α from the global model before evaluation")


def shuffled_batches(index: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of endless epochs, each reshuffled."""
    while True:
        yield from index[torch.randperm(len(index), generator=generator)].split(batch_size)


def _loss(model: nn.Module, names: list[str], params, batch: Batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(functional_call(model, dict(zip(names, params)), (x,)), y)


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


def adapt(model: nn.Module, ctx: ClientContext, alpha: float, steps: int) -> None:
    """``steps`` plain SGD steps w ← w − α∇f(w; D) on batches of the client's training data."""
    if steps == 0 or len(ctx.data.train) == 0:
        return
    model.train()
    params = list(model.parameters())
    stream = shuffled_batches(ctx.data.train, ctx.train_config.batch_size, ctx.generator)
    for _ in range(steps):
        x, y = ctx.dataset.batch(ctx.dataset.train, next(stream))
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g, alpha=alpha)


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
        params = list(model.parameters())
        optimizer = ctx.optimizer(params, lr=opts.beta)
        clip = ctx.train_config.grad_clip
        stream = shuffled_batches(ctx.data.train, ctx.train_config.batch_size, ctx.generator)
        for _ in range(local_steps(ctx, k)):
            batches = [ctx.dataset.batch(ctx.dataset.train, next(stream)) for _ in range(k)]
            direction, losses = meta_gradient(model, batches, alpha, hessian)
            for p, d in zip(params, direction):
                p.grad = d
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            for loss, (_, y) in zip(losses, batches):
                ctx.stats.loss_sum += float(loss) * len(y)
                ctx.stats.samples += len(y)
            ctx.stats.steps += 1
        optimizer.zero_grad(set_to_none=True)
        return ctx.reply(ctx.weights())

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        opts: PerFedAvgConfig = ctx.options
        model = ctx.load(msg.tensors)
        adapt(model, ctx, ctx.lr if opts.alpha is None else opts.alpha, opts.eval_steps)
        return ctx.evaluate()


PERFEDAVG = Algorithm(
    name="perfedavg",
    summary="Per-FedAvg (Fallah et al. 2020): MAML-style local steps (FO or HF), SGD adaptation before evaluation",
    server=FedAvgServer,
    client=PerFedAvgClient,
    config=PerFedAvgConfig,
)
