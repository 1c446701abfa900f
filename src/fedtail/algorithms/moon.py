"""MOON: Model-Contrastive Federated Learning.

Li, He and Song, CVPR 2021 (Algorithm 1). FedAvg in which client i, given the global model w^t
and its own model of its previous round w_i^{t−1}, minimises over its local model w

    ℓ = ℓ_CE(w; x, y) + μ · ℓ_con(w; x),

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),

where z, z_glob and z_prev are the representations of x by the model being trained, by the
global model w^t and by the previous local model w_i^{t−1} (the last two frozen), and sim is
the cosine similarity; ℓ_con is averaged over the batch. The contrastive term pulls z towards
the global model's representation and pushes it away from the client's previous one. The server
aggregates exactly like FedAvg, w^{t+1} = Σ_{i∈S_t} (n_i / n_S) · w_i^{t+1}, and the personalised
accuracy is that global model on each client's local test data (MOON has no personal model).

Defaults: μ = 1 (FedReMa's setting for MNIST and Fashion-MNIST; it uses μ = 5 on CIFAR-10,
MOON's own best values are 5 on CIFAR-10 and 1 on CIFAR-100 and Tiny-ImageNet); τ = 0.5 (MOON).

*Interpretations*:

- representation: MOON's networks end their base encoder in a projection head (two linear
  layers) whose output z is contrasted. fedtail's models have no projection head, so z is the
  body's output (``model.features``, the input of the classifier head); no extra layers are
  added, so the model and its parameter count are the same as for every other method.
- first participation: a client with no previous local model uses the global model it received
  as w_i^{t−1} (as MOON's code does in its first round). Then z_glob = z_prev, ℓ_con = log 2 for
  every sample and its gradient is zero: the first round of a client is FedAvg's local training.
- the previous model is the client's locally trained model of its *last participation* (kept in
  ``ctx.state["previous"]``), which under partial participation may be several rounds old.
- the frozen models run in eval mode (BatchNorm with running statistics) and without autograd.
- μ = 0 still computes the term (with weight 0), so it reproduces FedAvg's training exactly.

Missing replies (``--dropout``, rejected replies): the server is FedAvg's (the mean of the replies
that arrived); a client that did not reply keeps its previous local model w_i^{t−1}.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them):
the head is the last linear layer as in PFLlib (``model.fc``), whose implementation stands for
FedReMa's baseline, so z is the input of that layer (on ``cnn2fc`` FC 512's 512 outputs, not the
1024-d convolution output the model's own split gives); plain SGD (momentum 0), no clipping.
PFLlib's τ defaults to 1.0; FedReMa takes unstated values from the methods' papers, so τ = 0.5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pydantic import Field

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, ClientHalf, Message, Reference
from fedtail.algorithms.base import FeatureTerm
from fedtail.algorithms.fedavg import FedAvgServer

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext
    from fedtail.engine.training import FeatureLoss
    from fedtail.models import SplitModel


class MOONConfig(AlgorithmConfig):
    mu: float = Field(1.0, ge=0, description="μ: weight of the model-contrastive loss")
    tau: float = Field(0.5, gt=0, description="τ: temperature of the model-contrastive loss")


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Batch mean of −log(e^{sim(z,z_glob)/τ} / (e^{sim(z,z_glob)/τ} + e^{sim(z,z_prev)/τ})), sim = cosine."""
    positive = F.cosine_similarity(z, z_glob, dim=1) / tau
    negative = F.cosine_similarity(z, z_prev, dim=1) / tau
    logits = torch.stack([positive, negative], dim=1)
    # cross-entropy with target 0 is exactly −log softmax(logits)[0], computed stably
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def contrastive_term(global_model: SplitModel, previous: SplitModel, mu: float, tau: float) -> FeatureLoss:
    """μ · ℓ_con as a ``feature_loss``: the frozen models see the batch, the trained one's
    representation is the body output of its own forward pass."""
    global_model.eval()
    previous.eval()

    def term(model, x: torch.Tensor, y, logits, features: torch.Tensor) -> torch.Tensor:
        # no_grad, not inference_mode: the cosine saves these outputs for its backward
        with torch.no_grad():
            z_glob, z_prev = global_model.features(x), previous.features(x)
        return mu * contrastive_loss(features, z_glob, z_prev, tau)

    return term


class MOONClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: MOONConfig = ctx.options
        ctx.load(msg.tensors)
        global_model = ctx.load(msg.tensors, role="global")
        previous = ctx.load(ctx.state.get("previous", msg.tensors), role="previous")
        ctx.train(hook=FeatureTerm(contrastive_term(global_model, previous, opts.mu, opts.tau)))
        weights = ctx.weights()
        ctx.state["previous"] = weights
        return ctx.reply(weights)


MOON = Algorithm(
    name="moon",
    summary="MOON (Li et al. 2021): FedAvg with a model-contrastive loss towards the global model's features",
    server=FedAvgServer,
    client=MOONClient,
    config=MOONConfig,
    reference=Reference(PFLLIB, head="last"),
    personal_model=False,
    why_not={"segmentation": "its model-contrastive loss compares flat per-sample representations"},
    robust=True,
    dp=True,
)
