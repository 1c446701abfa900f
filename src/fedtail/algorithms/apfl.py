"""APFL: Adaptive Personalized Federated Learning.

Deng, Kamani and Mahdavi, arXiv:2003.13461, 2020 (Algorithm 1, with the adaptive mixing weight).
Client i keeps a local model v_i and a mixing weight α_i; its personalised model is the
parameter-space mixture

    v̄_i = α_i · v_i + (1 − α_i) · w_i.

The federation trains the global model w with FedAvg. In every local step on a batch ξ a
sampled client updates its copy of the global model, its local model and its weight:

    w_i ← w_i − η · ∇f_i(w_i; ξ)
    v_i ← v_i − η · ∇_v f_i(v̄_i; ξ)              with ∇_v f_i(v̄_i) = α_i · ∇f_i(v̄_i)
    α_i ← clip_[0,1]( α_i − η_α · ∇_α f_i(v̄_i; ξ) )  with ∇_α f_i(v̄_i) = ⟨v_i − w_i, ∇f_i(v̄_i)⟩

and uploads w_i only (v_i and α_i never leave the client). The server aggregates like FedAvg,
w^{t+1} = Σ_{i∈S_t} (n_i/n_S) · w_i. Each step costs one forward/backward at w_i and one at v̄_i,
which gives the gradients with respect to v_i and α_i together. Since w_i never depends on v_i
or α_i, the global model is FedAvg's, bit for bit.

Defaults and *interpretations*:

- ``alpha`` = 0.5, the initial α_i (the default of the authors' code's parameters.py; its
  run_mpi.py launcher passes 0); ``adaptive`` = true, the paper's Algorithm 1 (the authors' code
  adapts α only with --fed_adaptive_alpha). With ``adaptive`` = false α_i stays at ``alpha``;
  α = 0 is then exactly FedAvg (evaluated with w).
- ``alpha_lr`` = null: η_α is the run's learning rate, as in the paper's analysis (one step
  size η_t for all three updates) and the authors' code.
- ``mix_w`` = "updated": v̄_i mixes the copy of w_i *after* this step's update (the authors'
  code trains w_i first, then v_i on the same batch). "previous": the w_i of before the step,
  as Algorithm 1 indexes it (w_i^{(t)} and v_i^{(t)} both computed from step t − 1).
  Either way ∇_α uses the same v_i and w_i that make up v̄_i, so it is the exact derivative.
- ``eval_w`` = "global": a client is evaluated with v̄_i = α_i v_i + (1 − α_i) w, mixing the
  latest global model w, as a client holds it after synchronisation (Algorithm 1 sets w_i = w
  there). "local": mixing the client's own w_i at the end of its last local training (the
  authors' code evaluates before aggregating); it keeps one more model per client.
- ``personal_start`` = "global": v_i starts as the global model the client receives the first
  time it is sampled (so v̄_i starts at w); "initial": the run's common initial model. In
  round 1 both are the same model. A client never sampled is evaluated with the global model.
- w_i and v_i each use the run's SGD (momentum, weight decay, gradient clipping) at the run's
  learning rate; α_i takes plain gradient steps. The local schedule (--local-epochs or
  --local-steps, batch order) is exactly FedAvg's: the v_i and α_i updates run on each batch
  that local training draws for w_i. The reported training loss is w_i's, as in FedAvg.
- Beyond the parameters, v̄_i's floating-point buffers (BatchNorm running statistics) are mixed
  with the same α_i and integer buffers taken from w. In training, the forward at v̄_i uses and
  updates v_i's own buffers.

Reference (``fedtail list``): the authors' code (MLOPTPSU/FedTorch) trains with weight decay
1e-4 and momentum 0, starts v_i at the common initial model (``personal_start`` = "initial") and
evaluates a client after its local training, before aggregation (``eval_w`` = "local"). A run
that sets none of these gets them; the option defaults above are the paper's reading.

The authors' code differs from the paper in ways not followed here: it mixes the two models'
outputs, α·v(x) + (1 − α)·w(x), rather than their parameters, and updates α once per round
(first batch) with an extra 0.02·α term in its gradient.

Missing replies (``--dropout``, rejected replies): the global model is FedAvg's mean of the
replies that arrived; a client that did not reply keeps v_i and α_i unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field
from torch.func import functional_call

from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, Message, Reference, Tensors, cross_entropy
from fedtail.algorithms.base import StepHook
from fedtail.algorithms.fedavg import FedAvgServer

if TYPE_CHECKING:
    from torch import nn

    from fedtail.engine.context import ClientContext


class APFLConfig(AlgorithmConfig):
    alpha: float = Field(0.5, ge=0, le=1, description="α: initial mixing weight of the local model v in v̄")
    adaptive: bool = Field(True, description="learn each client's α by gradient steps (false: α stays fixed)")
    alpha_lr: float | None = Field(None, gt=0, description="η_α: step size of the α update (null: the run's --lr)")
    mix_w: Literal["updated", "previous"] = Field(
        "updated", description="w in v̄ during a step: after this step's update of w, or before it"
    )
    eval_w: Literal["global", "local"] = Field(
        "global", description="w in the evaluated v̄: the latest global model, or the client's last local w"
    )
    personal_start: Literal["global", "initial"] = Field(
        "global", description="v's start: the global model first received, or the run's initial model"
    )


def mixed_backward(
    personal: nn.Module, w: list[torch.Tensor], alpha: float | torch.Tensor, x: torch.Tensor, y: torch.Tensor,
    adaptive: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward/backward of the cross-entropy at v̄ = α·v + (1 − α)·w on a batch.

    v is the parameters of ``personal``, ``w`` the matching tensors (not differentiated). Leaves
    ∇_v f(v̄) = α·∇f(v̄) in v's ``.grad`` and returns the loss and ∂f(v̄)/∂α = ⟨v − w, ∇f(v̄)⟩
    (a 0-dim tensor; None when not ``adaptive``). The forward runs ``personal``'s own buffers.
    """
    names, v = zip(*personal.named_parameters())
    a = torch.as_tensor(alpha, dtype=v[0].dtype, device=v[0].device).detach().requires_grad_(adaptive)
    mixed = {name: a * p + (1 - a) * q.detach() for name, p, q in zip(names, v, w, strict=True)}
    loss = cross_entropy(functional_call(personal, mixed, (x,)), y)
    loss.backward()
    return loss.detach(), a.grad if adaptive else None


def mix(v: Tensors, w: Tensors, alpha: float) -> Tensors:
    """v̄ = α·v + (1 − α)·w over floating-point tensors; integer buffers are taken from w."""
    return {k: alpha * v[k] + (1 - alpha) * w[k] if w[k].is_floating_point() else w[k] for k in w}


class _PersonalSteps(StepHook):
    """The v and α updates, run on every batch that ``ctx.train`` draws for w.

    The hook of w's ``ctx.train``: ``loss`` sees the batch before w's step (and adds nothing to
    w's loss), ``after_step`` runs after it, so the batches, their order and the number of steps
    are exactly those of w's local training.
    """

    def __init__(self, ctx: ClientContext, personal: nn.Module, w: list[torch.Tensor], alpha: float) -> None:
        opts: APFLConfig = ctx.options
        self.personal = personal
        self.params = list(personal.parameters())
        self.w = w
        self.optimizer = ctx.optimizer(self.params, role="personal")
        self.clip = ctx.train_config.grad_clip
        # α as a float64 number on the device: updated there step by step (the host's arithmetic,
        # bit for bit) and read back once, by :attr:`value`
        self.alpha = torch.tensor(alpha, dtype=torch.float64, device=ctx.device)
        self.alpha_lr = ctx.lr if opts.alpha_lr is None else opts.alpha_lr
        self.adaptive = opts.adaptive
        self.updated = opts.mix_w == "updated"
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor, features: None) -> torch.Tensor:
        if self.updated:
            self.batch = (x, y)
        else:
            self.step(x, y)  # w has not moved yet
        return logits.new_zeros(())

    def after_step(self, loss: torch.Tensor) -> None:
        if self.updated:
            assert self.batch is not None
            self.step(*self.batch)
            self.batch = None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        _, grad_alpha = mixed_backward(self.personal, self.w, self.alpha, x, y, self.adaptive)
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()
        if self.adaptive:
            self.alpha = (self.alpha - self.alpha_lr * grad_alpha.double()).clamp(0.0, 1.0)

    @property
    def value(self) -> float:
        """α after the steps."""
        return float(self.alpha)


class APFLClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: APFLConfig = ctx.options
        model = ctx.load(msg.tensors)
        v = ctx.state.get("v")
        if v is None:
            v = msg.tensors if opts.personal_start == "global" else ctx.init_weights
        personal = ctx.load(v, role="personal")
        personal.train()
        steps = _PersonalSteps(ctx, personal, list(model.parameters()), ctx.state.get("alpha", opts.alpha))
        ctx.train(hook=steps)
        steps.optimizer.zero_grad(set_to_none=True)
        upload = ctx.weights()
        ctx.state["v"] = ctx.weights("personal")
        ctx.state["alpha"] = steps.value
        if opts.eval_w == "local":
            ctx.state["w"] = upload
        return ctx.reply(upload)

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        opts: APFLConfig = ctx.options
        if "v" not in ctx.state:  # never sampled: the global model
            ctx.load(msg.tensors)
        else:
            # a client state without w (written under eval_w = global) mixes the message's w
            w = ctx.state.get("w", msg.tensors) if opts.eval_w == "local" else msg.tensors
            ctx.load(mix(ctx.state["v"], w, ctx.state["alpha"]))
        return ctx.evaluate()


APFL = Algorithm(
    name="apfl",
    summary="APFL (Deng et al. 2020): FedAvg global model mixed with a local model by a learned per-client α",
    server=FedAvgServer,
    client=APFLClient,
    config=APFLConfig,
    reference=Reference(
        "the authors' code (MLOPTPSU/FedTorch)",
        weight_decay=1e-4,
        options={"personal_start": "initial", "eval_w": "local"},
    ),
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
