"""CReFF: classifier re-training with federated features.

Shang et al., "Federated Learning on Heterogeneous and Long-Tailed Data via Classifier
Re-Training with Federated Features", IJCAI 2022. The model is trained by plain FedAvg; a
classifier re-trained on server-side synthetic "federated features" replaces FedAvg's biased
classifier for evaluation. Round t:

1. the server sends each sampled client the FedAvg model w^{t−1} and the re-trained
   classifier θ^{t−1};
2. client k computes, with FedAvg's body and θ^{t−1} (body frozen, eval mode), the per-class
   gradient g_k^c of the CE w.r.t. the classifier on real samples of every class c it holds
   (MuPFL Eq. 16), then trains w^{t−1} locally as in FedAvg and uploads w_k^t and the g_k^c;
3. w^t = Σ_k (n_k / n) w_k^t (FedAvg); g^c = mean of g_k^c over the clients holding c (Eq. 17);
4. the federated features are updated by gradient matching under θ^{t−1} (Eq. 19-20, see
   :class:`~fedtail.algorithms.federated_features.FederatedFeatures`);
5. θ^t = a freshly initialised linear classifier trained on the features (Eq. 21).

Equation numbers are those of MuPFL's restatement of CReFF (PKCF, the MuPFL paper), the text at hand.

Evaluation (each client's local test data and the global test split) uses w^t's body with θ^t;
training always continues from the plain FedAvg model w^t.

Details taken from the authors' code (the paper leaves them open):

- clients compute their gradients **before** local training, with the received FedAvg body and
  the current re-trained classifier θ^{t−1}, the same classifier the server matches under;
  θ^0 is the initial model's classifier (a default-initialised Linear, as the authors' θ^0);
- each class gradient is the mean over 10 draws of 32 samples of the class (``grad_repeats``,
  ``grad_batch``); server aggregation is the uniform mean over holders, not sample-weighted;
- 100 features per class, initialised once and kept across rounds; 100 matching iterations of
  SGD; the loss sums 1 − cos over the weight-gradient rows plus 1 − cos of the bias gradients,
  with 1e-6 added to the norm product;
- re-training: a fresh Linear (PyTorch's default init) trained 300 epochs on all C·m features,
  batch 32, SGD lr 0.01 without momentum; classes no client has reported yet still take part
  with their initial features, as in the code.

Defaults are the configuration validated in ``benchmarks/mupfl`` (issue 16), not the authors':
features drawn from N(0, 0.1²) and matched with lr 100. The authors' N(0, 1) and lr 0.1 were
chosen for 256-d ResNet-8 features; on cnn-fmnist's 3136-d features lr 0.1 barely moves the
matching loss and unit-variance features are separable by their noise alone (the validation
numbers: ``benchmarks/mupfl/README.md``, "Choices the paper leaves open"). The authors' values stay available:
``--set creff.feature_init_std=1 --set creff.match_lr=0.1``.

Features live in the input space of the model's last Linear (``model.classifier``): the body
output for single-Linear heads (cnn-fmnist, resnet8, mlp), the hidden layer before the last
Linear for deeper heads (cnn2fc), whose other head layers then stay FedAvg's.

Missing replies (``--dropout``, rejected replies): w^t averages the models that arrived and g^c
the gradients of the replying clients that hold c; a class none of them holds is left out of the
matching (its features keep their values) and still takes part in the re-training.

Devices: the server's feature matching and classifier re-training run on the compute device (the
features and the averaged gradients go there for the round and come back to the CPU); clients on
``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch
from pydantic import Field

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, Comm, Message, Reference, ServerHalf, Tensors
from fedtail.algorithms.federated_features import (
    ClassGradientMean,
    FederatedFeatures,
    class_gradients,
    pack_class_gradients,
    reset_linear,
    train_classifier,
    unpack_class_gradients,
)

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.models import SplitModel

# Names of the extra tensors on the wire; model state_dict keys never start with these.
RETRAINED = "creff.classifier."  # server -> client: θ^{t-1} ("weight", "bias")
GRADS = "creff.grad."  # client -> server: packed per-class gradients


class CReFFConfig(AlgorithmConfig):
    """CReFF options (defaults: the authors' code except the two validated ones below)."""

    num_features: int = Field(100, ge=1, description="federated features per class (m)")
    match_iterations: int = Field(100, ge=0, description="SGD steps of feature matching per round")
    # 0.1 is the authors' value for 256-d ResNet-8 features; the cosine loss's gradient shrinks
    # with the feature size, and 3136-d cnn-fmnist features need about 100
    # (benchmarks/mupfl/feature_matching_validation.py).
    match_lr: float = Field(100.0, gt=0, description="learning rate of feature matching (validated; the authors' 0.1)")
    # The authors draw N(0, 1); with C·m features in D > C·m dimensions the re-trained classifier
    # can fit that noise (benchmarks/mupfl/feature_init_validation.py).
    feature_init_std: float = Field(
        0.1, gt=0, description="std of the features' initial N(0, σ²) draw (validated; the authors' 1)"
    )
    retrain_epochs: int = Field(300, ge=1, description="epochs of classifier re-training per round")
    retrain_batch: int = Field(32, ge=1, description="batch size of classifier re-training")
    retrain_lr: float = Field(0.01, gt=0, description="learning rate of classifier re-training")
    grad_repeats: int = Field(10, ge=1, description="draws per class for the real gradients")
    grad_batch: int = Field(32, ge=1, description="samples per draw for the real gradients")


def classifier_names(model: SplitModel) -> tuple[str, str]:
    """state_dict keys of the classifier's weight and bias."""
    keys = model.classifier_keys()
    weight = [k for k in keys if k.endswith("weight")]
    bias = [k for k in keys if k.endswith("bias")]
    if len(weight) != 1 or len(bias) != 1:
        raise ValueError(f"CReFF needs a Linear classifier with weight and bias (keys {keys})")
    return weight[0], bias[0]


def set_linear(layer: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Copy ``weight`` and ``bias`` into ``layer`` in place."""
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)


class CReFFServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: CReFFConfig = ctx.options
        self.weights: Tensors = dict(ctx.init_weights)
        model = ctx.model()
        self.keys = classifier_names(model)
        # θ^0: the initial model's classifier (default Linear init, like the authors' first θ).
        self.retrained: Tensors = {name: self.weights[key].clone() for name, key in zip(("weight", "bias"), self.keys)}
        # The server's working classifier, on the compute device: matched under, then re-drawn and
        # re-trained, every round (the features go there for it, the results come back to the CPU).
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # its init is overwritten; leave the global stream alone
            linear = torch.nn.Linear(model.classifier.in_features, model.classifier.out_features)
        self.linear = linear.to(ctx.device)
        generator = torch.Generator(device="cpu").manual_seed(ctx.seed(0xFEA7))
        self.features = FederatedFeatures(
            ctx.num_classes, model.classifier.in_features, opts.num_features, generator,
            lr=opts.match_lr, iterations=opts.match_iterations, init_std=opts.feature_init_std,
        )
        self._eval: Tensors | None = None

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: CReFFConfig = self.ctx.options
        C = self.ctx.num_classes
        out = self.weights | {RETRAINED + name: value for name, value in self.retrained.items()}
        models, grads = WeightedMean(), ClassGradientMean()
        for _, reply in comm.stream({cid: Message("fit", out) for cid in clients}):
            weights = {k: v for k, v in reply.tensors.items() if not k.startswith(GRADS)}
            models.add(weights, reply.num_examples)
            grads.add(*unpack_class_gradients(reply.tensors, C, prefix=GRADS))
        self.weights = models.result()
        real, present = grads.result()

        # Match under θ^{t-1}, the classifier the clients' gradients were taken with.
        set_linear(self.linear, self.retrained["weight"], self.retrained["bias"])
        before, after = self.features.match(self.linear, real, present)

        generator = torch.Generator(device="cpu").manual_seed(self.ctx.seed(rnd, 0xC1F))
        reset_linear(self.linear, generator)  # "a fresh linear classifier" every round
        train_classifier(
            self.linear, self.features.features, self.features.labels,
            epochs=opts.retrain_epochs, batch_size=opts.retrain_batch, lr=opts.retrain_lr, generator=generator,
        )
        self.retrained = {name: getattr(self.linear, name).detach().to("cpu", copy=True) for name in ("weight", "bias")}
        self._eval = None
        comm.log(creff_match_loss_before=before, creff_match_loss_after=after, creff_classes=int(present.sum()))

    def global_weights(self) -> Tensors:
        """FedAvg's model with the re-trained classifier (what CReFF evaluates)."""
        if self._eval is None:
            w, b = self.keys
            self._eval = self.weights | {w: self.retrained["weight"], b: self.retrained["bias"]}
        return self._eval

    def evaluation_message(self, cid: int) -> Message:
        return Message("evaluate", self.global_weights())

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "retrained": self.retrained, "features": self.features.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weights = dict(state["weights"])
        self.retrained = dict(state["retrained"])
        self.features.load_state_dict(state["features"])
        self._eval = None


class CReFFClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: CReFFConfig = ctx.options
        weights = {k: v for k, v in msg.tensors.items() if not k.startswith(RETRAINED)}
        model = ctx.load(weights)
        # Real gradients first, under FedAvg's body and θ^{t-1} (authors' code), then put
        # FedAvg's classifier back for ordinary local training.
        set_linear(model.classifier, msg.tensors[RETRAINED + "weight"], msg.tensors[RETRAINED + "bias"])
        grads, present = class_gradients(
            model, ctx.dataset, ctx.data.train, ctx.num_classes, ctx.generator,
            repeats=opts.grad_repeats, batch_size=opts.grad_batch, labels=ctx.data.labels,
        )
        w, b = classifier_names(model)
        set_linear(model.classifier, weights[w], weights[b])
        ctx.train()
        return ctx.reply(ctx.weights() | pack_class_gradients(grads, present, prefix=GRADS))


CREFF = Algorithm(
    name="creff",
    summary="CReFF (Shang et al. 2022): FedAvg + classifier re-trained on gradient-matched federated features",
    server=CReFFServer,
    client=CReFFClient,
    config=CReFFConfig,
    personal_model=False,
    reference=Reference("the authors' code (shangxinyi/CReFF-FL)"),
    tasks=("classification", "segmentation"),
    robust=True,
    dp="also uploads per-class gradients of real features, which are not updates of the model sent",
)
