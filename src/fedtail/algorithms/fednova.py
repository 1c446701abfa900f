"""FedNova: Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization.

Wang, Liu, Liang, Joshi and Poor, NeurIPS 2020. Clients that take more local steps move further,
so FedAvg's average drifts towards the objective of the clients with the most data. FedNova
averages normalised updates instead. Client i starts from w^t, runs τ_i local SGD steps
(τ_i grows with its data size) to w_i and sends

    d_i = (w^t − w_i) / ‖a_i‖₁,

where a_i weights the client's gradients in its total update: ‖a_i‖₁ = τ_i for plain SGD, and
with momentum ρ the running counter κ_k = ρ·κ_{k−1} + 1 (κ_0 = 0) summed, ‖a_i‖₁ = Σ_{k=1}^{τ_i} κ_k
(PyTorch's heavy-ball momentum applies gradient k with weight Σ_{m=0}^{τ_i−k} ρ^m). The server,
with p_i = n_i / Σ_{j∈S_t} n_j, sets

    τ_eff = Σ_i p_i ‖a_i‖₁,    w^{t+1} = w^t − τ_eff · Σ_i p_i d_i.

When every client takes the same number of plain-SGD steps this is exactly FedAvg.

Reference settings: the authors' code (JYWa/FedNova, ``train_LocalSGD.py``) trains every method
with weight decay 10⁻⁴ (hard-coded) and momentum 0 by default; weight decay enters the gradient,
so ‖a_i‖₁ is unchanged. Its proximal variant (``mu``) and server momentum (``gmf``) default to 0
and are not implemented; its step-decay learning-rate schedule belongs to its experiments, so a
run keeps the benchmark's schedule. The authors' workers keep their own BatchNorm buffers; here
they are averaged with weights n_i (no model of MuPFL's Table II has BatchNorm).

Missing replies (``--dropout``, rejected replies): p_i, Σ_i p_i d_i and τ_eff are taken over the
clients that replied (p_i = n_i / Σ_j n_j over them), as if the others had not been sampled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import Algorithm, ClientHalf, Comm, Message, Reference, ServerHalf, Tensors

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext


def normalizer(steps: int, momentum: float) -> float:
    """‖a‖₁ of ``steps`` SGD steps with heavy-ball ``momentum`` (= ``steps`` without momentum)."""
    kappa = total = 0.0
    for _ in range(steps):
        kappa = momentum * kappa + 1.0
        total += kappa
    return total


class FedNovaServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.weights: Tensors = dict(ctx.init_weights)
        # Only trained parameters are normalised; buffers (BatchNorm running statistics and
        # the integer num_batches_tracked) are not gradient steps, so they are averaged as in FedAvg.
        self.params = {name for name, _ in ctx.model().named_parameters()}

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        mean = WeightedMean()  # weights n_i: the mean is Σ p_i d_i (and Σ p_i · buffer_i)
        tau_sum = 0.0
        for _, reply in comm.stream({cid: Message("fit", self.weights) for cid in clients}):
            n = reply.num_examples
            mean.add(reply.tensors, n)
            tau_sum += n * reply.metrics["a_norm"]
        if mean.total <= 0:  # no reply carried a training sample: nothing to average
            comm.log(tau_eff=0.0)
            return
        tau_eff = tau_sum / mean.total
        avg = mean.result()
        self.weights = {
            name: self.weights[name] - tau_eff * value if name in self.params else value for name, value in avg.items()
        }
        comm.log(tau_eff=tau_eff)

    def global_weights(self) -> Tensors:
        return self.weights


class FedNovaClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        model = ctx.load(msg.tensors)
        stats = ctx.train()
        a_norm = normalizer(stats.steps, ctx.train_config.momentum)
        params = {name for name, _ in model.named_parameters()}
        # A client without training samples took no step: no direction to normalise (and n_i = 0).
        divisor = a_norm if a_norm > 0 else float("inf")
        update = {
            name: (msg.tensors[name] - value) / divisor if name in params else value
            for name, value in ctx.weights().items()
        }
        return ctx.reply(update, a_norm=a_norm)


FEDNOVA = Algorithm(
    name="fednova",
    summary="FedNova (Wang et al. 2020): average of step-normalised updates, rescaled by the effective steps",
    server=FedNovaServer,
    client=FedNovaClient,
    personal_model=False,
    reference=Reference("the authors' code (JYWa/FedNova)", weight_decay=1e-4),
    tasks=("classification", "segmentation"),
    robust=True,
    uploads="updates",
    dp="uploads normalised updates and step counts, whose mean is not of a model it was sent",
)
