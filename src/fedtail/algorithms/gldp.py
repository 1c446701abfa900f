"""GLDP: Global-Local Dynamic Prototypes for spatio-temporal heterogeneous FL (STHFL).

Guo, Wang, Lin, Yang and Geng, "STHFL: Spatio-Temporal Heterogeneous Federated Learning",
arXiv:2501.05775, 2025 (Sec. 4, Algorithm 1). The text we have lost its equations, and the
authors published no code. Below, every sentence of the paper that fixes a choice is quoted
beside it; parts fixed by the first author's sibling project FedPRP (the same design) are
marked "code"; the rest is *reconstructed* (listed at the end) and, where it matters, an option.

Model and communication. "The participating clients train a common underlying representation
and their respective personalized representations" (Sec. 1); the model "contains two parts which
are the representation layer φ and the classification layer θ" (Sec. 4.1), and "we only
transfer the shared presentation layer to the server-side aggregation" (Sec. 4.1). So φ is every
layer but the final classifier (the body and any head layers before the classifier), θ_k
(``model.classifier_keys()``) never leaves client k. "At the m-th stage of t-th global round"
the server aggregates φ over "the set of selected clients" (Eq. 5, lost): uniformly over the
online clients (code; ``shared_weighting = samples`` weights by training size, as FedAvg), and a
client is evaluated with the current φ and its own θ_k (its initial θ_k: the run's common one).

Schedule. "Algorithm 1 describes the specific optimization process of the multi-stage local
model in one round of global optimization", of time complexity about O(M·E) per round, and "we
update the local model via optimizing Eq. 12, and then aggregate parameter and local prototype
in central server to obtain the global model and global prototype set for the next stage": the
engine's default ``--stage-schedule nested`` (each round of global optimisation trains the M
stage tasks in turn, one communication round each; ``blocks`` is the alternative). Locally (code)
θ_k first, for ``head_epochs`` (5) epochs with φ frozen, loss CE (the prototype losses depend on φ
only); then φ with θ_k frozen for ``body_epochs`` epochs (Eqs. 3-4 update φ and θ "with different
times"), loss (Eq. 12)

    L = CE + λ · L_LPR + (1 − λ) · L_GLPR,          λ = 0.5.

λ's side: "λ is a hyperparameter representing the ratio of the two loss functions of L_LPR and
L_GLPR" (Sec. 4.2), and the ablation (Sec. 5.4): "When λ = 0, it means that the client only uses
the global-local relationship loss ... When λ = 1, it means that there is no interactive learning
of prototype knowledge among clients, only local prototype learning in the pre-stage and
post-stage", with "performance drops 9.58% without global-local prototype relation loss" the
λ = 1 row of Table 4 (36.82 − 27.24 on CIFAR-100). "We set λ = 0.5 to trade off the global and
local prototype learning" (Sec. 5.1). Table 4's row without both losses ("their joint absence")
is ``glpr = false, lpr = false``; ``glpr`` / ``lpr`` switch one term off whatever λ.

Prototypes. z = φ(x) is the classifier's input. Local prototype (Eq. 6): the mean of z over the
client's current training samples of class j, computed after the local epochs with the trained
model in inference mode. Eq. 9: "the j-th local prototype is updated to retain the learned
knowledge of the old class new samples according to the moving average", "we set β = 0.5 for old
classes in order to tradeoff the new and old sample knowledge of the same class", and "the
prototype of the new class is added directly":

    c_k^j ← β · c_new^j + (1 − β) · c_k^j   for classes it already has a prototype of,
    c_k^j ← c_new^j                          for new classes.

The client uploads all its local prototypes (the classes it holds so far). Global prototypes:
"for each label, we have a prototype which is calculated by averaging the embedding vectors of
the same label in different clients", "updated on server-side similar as Eq. 9" over "K_j, the
set of clients that have class j" (Eq. 11), and "the global-local prototypes are updated through
the moving average method" (abstract):

    C^j ← β_g · mean_{k ∈ K_j} c_k^j + (1 − β_g) · C^j    (β_g = ``global_beta``, default β),

new classes added directly; classes held by no online client keep their prototype.
(``global_beta = 1`` replaces C^j by the mean, as FedPRP's code does.)

Prediction (Eq. 13): "we use the distance between the test sample's embedding representation
vector and the prototype to obtain the predicted label", with "c_k^j the j-th local prototype of
k-th client, and can be replaced with the C^j of the j-th global prototype on testing"; "the
GLDP-GP is the prediction obtained using the global prototype ..., while the result predicted
using the local prototype is recorded as GLDP-LP" (Sec. 5.2). Every evaluation reports three
named accuracies of the same model: ``gp`` (nearest global prototype), ``lp`` (nearest local
prototype) and ``head`` (the classifier θ_k); ``predict`` picks the headline one (default
``global``: GLDP-GP). A client without a usable prototype is scored by its classifier.

Losses (a reconstruction of Eqs. 7, 8 and 10):

- L_LPR (Eqs. 7-8): "a local prototype relation loss to guide the prototype at the new stage by
  the one at the previous stage. If the local prototype of class j exists at the k-th client,
  the loss at the m-th stage is defined as [a Kullback-Leibler divergence], where c_old
  represents the locally old class prototype of previous stages", p "the corresponding
  prediction probability" of the samples under the old prototypes and a local model. Here
  L_LPR = KL(p(·|x; c_old, φ_old) ‖ p(·|x; c_old, φ)) over the current stage's samples, batch
  mean, with p(y = j | x; c) = softmax_j(cos(z, c^j) / τ), τ = 0.07 (code: FedPRP scores
  features against prototypes by the "pairwise cosine similarity" of unit vectors over its
  ``temperature`` 0.07; it negates that similarity, apparently a leftover of a distance-based
  version; here the most similar prototype gets the highest probability, as Eq. 13 predicts
  the nearest one). c_old are the client's local prototypes and φ_old its own trained shared
  layers at the end of the previous stage task it trained, kept in ``ctx.state`` and run in a
  workspace model in inference mode. It is 0 before a client has trained another stage, and in
  runs without stage tasks. With scores in [−1, 1] the logits stay within ±1/τ, so
  L_LPR ≤ 4/τ and ‖∂L_LPR/∂z_i‖ ≤ 2/(B·τ·‖z_i‖) whatever the features' scale.
  *Why not distances*: softmax_j(−‖z − c^j‖²/τ) (``relation = "distance"``, kept for comparison
  only) has logit gaps in the thousands with raw features (norms about 20 for cnn-fmnist): on
  fmnist stages L_LPR reached 3.7·10¹² and CE 2·10¹⁴ by round 3, NaN at round 4.
- L_GLPR (Eq. 10): "a global-local prototype relation loss to make the local prototype
  approximate to the global prototype. In this way, the biased local model caused by the class
  with few samples is reduced", with "n_k^j the number of instances belonging to class j over
  k-th client and c_k^j the local prototype of the j-th label". Here, per sample,
  L_GLPR = Σ_i w_{y_i} · ‖z_i − C^{y_i}‖² / (B·d) (``alignment = mse``; ``l2sq`` divides by B
  only), samples whose label has no global prototype adding 0, with w_j = n_k / (J_k · n_k^j)
  (``glpr_weighting = inverse_frequency``: n_k^j the client's current training samples of class
  j, n_k = Σ_j n_k^j, J_k the classes present), so every class weighs the same in total
  (n_k^j · w_j = n_k / J_k): the mean over classes of (1/n_k^j) Σ_{i∈j} ‖z_i − C^j‖², which is
  ‖c_k^j − C^j‖² (the paper's local-to-global prototype distance, with c_k^j the class mean of
  Eq. 6) plus the class's feature variance. Per sample, its batch estimate is unbiased for the
  whole-data prototype c_k^j; a distance of batch means would not be. ``none``: w ≡ 1.

Other options:

- ``body_epochs`` (default: the run's --local-epochs, or --local-steps; "we set the number of
  local training epoch E" for all methods): FedPRP's code trains the shared layers 25 epochs per
  round (``--set gldp.body_epochs=25``). ``head_epochs`` = 5 (code).
- ``global_model`` (the model behind global_acc / A_global). The paper's "global model" is the
  averaged φ with nearest-prototype prediction: its two STHFL tables (Sec. 5.3, A_global and
  A_local) give GLDP-GP/LP the very same numbers in every setting they share, i.e. each
  client's data predicted among its held classes, which is this module's personalised
  evaluation: compare the paper's A_global of GLDP with ``a_local``. The engine's global
  evaluation is a plain forward of one model without any client's classes, so ``prototypes``
  (default) is φ with the nearest-global-prototype rule over every class that has a global
  prototype, written as a final linear layer (w_j = 2C^j/d, b_j = −‖C^j‖²/d, whose logits are
  −‖z − C^j‖²/d + ‖z‖²/d; classes without a prototype get bias −1e9); ``mean_classifier`` is φ
  with the uniform mean of the latest round's participants' classifiers (uploaded for that
  purpose only; no client ever receives it); ``none``: no global model.
- Prototypes live in the classifier's input space (the paper's "representation layer", all
  shared layers): the body's output for every model whose head is the classifier alone (mlp,
  cnn-fmnist, convnet, resnet: the paper's ResNet-18), the output of the shared head layers for
  multi-layer heads (cnn2fc, alexnet-small).
- Memory: with stage tasks a client keeps its latest trained shared layers (for φ_old) besides
  its classifier and prototypes, two copies at a stage change; without stages none.

*Reconstructed* (the paper's text does not fix them): the aggregation weights of Eq. 5 (uniform,
code); the form of p in Eq. 8 (cosine / τ, code) and which model produces p_old (the client's φ at
the end of its previous stage task); Eq. 10's per-sample form and class weights; the local
schedule (classifier first, code); the classes a prediction chooses among ("holds": the classes
of the client's stages trained so far, or of its training data without stages); the evaluated
model of a client that never trained (φ with the initial classifier); the global model
(``global_model``).

Missing replies (``--dropout``, rejected replies): φ, the global prototypes (over the replying
holders of each class) and the mean classifier average the replies that arrived; a class none of
them holds keeps its previous global prototype. A client that did not reply keeps its classifier,
local prototypes and stage state, as a client not sampled.

Devices: the server's prototype means run on the CPU, where the uploads arrive; the clients'
prototypes, losses and nearest-prototype prediction on ``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ClientHalf,
    Comm,
    Message,
    ServerHalf,
    Tensors,
    class_counts,
    FeatureTerm,
)
from fedtail.algorithms.fedproto import MEANS, PRESENT, global_prototypes, prototype_payload
from fedtail.algorithms.fedrep import train_only
from fedtail.algorithms.prototypes import Alignment, ClassMean, ClassStats, nearest_prototype_scores

if TYPE_CHECKING:
    from fedtail.data.base import Dataset
    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.engine.training import FeatureLoss
    from fedtail.models import SplitModel

# Upload: MEANS (C, d) local prototypes and PRESENT (C,) the classes the client has one of;
# download: MEANS / PRESENT of the global prototypes (FedProto's names).
ABSENT_BIAS = -1e9  # a class without a global prototype in the global model's prototype layer
OLD_ROLE = "gldp.old"  # workspace model holding the client's shared layers of its previous stage


class GLDPConfig(AlgorithmConfig):
    lam: float = Field(
        0.5, ge=0, le=1, description="λ: L = CE + λ·L_LPR + (1−λ)·L_GLPR (0: only L_GLPR, 1: only L_LPR)"
    )
    glpr: bool = Field(True, description="the global-local prototype relation loss L_GLPR (false: off, ablation)")
    lpr: bool = Field(True, description="the local prototype relation loss L_LPR (false: off, ablation)")
    tau: float = Field(0.07, gt=0, description="τ: temperature of p(j|x) = softmax_j(cos(z, c_j)/τ) in L_LPR")
    relation: Literal["cosine", "distance"] = Field(
        "cosine",
        description="L_LPR scores: cos(z, c_j)/τ (FedPRP), or −‖z − c_j‖²/τ (earlier reading; diverges at τ = 0.07)",
    )
    beta: float = Field(0.5, gt=0, le=1, description="β: local prototypes c ← β·c_new + (1−β)·c_old")
    global_beta: float | None = Field(
        None, gt=0, le=1,
        description="β_g: global prototypes C ← β_g·mean + (1−β_g)·C_old (null: β, Eq. 11; 1: replace, as FedPRP)",
    )
    head_epochs: int = Field(5, ge=1, description="epochs on the final classifier (shared layers frozen), first")
    body_epochs: int | None = Field(
        None, ge=1, description="epochs on the shared layers (classifier frozen), second (null: the run's local epochs)"
    )
    predict: Literal["global", "local", "head"] = Field(
        "global",
        description="the headline accuracy: nearest global prototype (GLDP-GP), local prototype (GLDP-LP) or the "
        "classifier (all three are reported as the named accuracies gp, lp, head)",
    )
    glpr_weighting: Literal["inverse_frequency", "none"] = Field(
        "inverse_frequency", description="L_GLPR weight of class j: n_k/(J_k·n_k^j) (few-sample classes more), or 1"
    )
    alignment: Alignment = Field(
        "mse", description="L_GLPR: mse = mean over samples and feature dims; l2sq = mean squared L2 distance"
    )
    shared_weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="average of the shared layers: uniform over online clients (code) or by sample count"
    )
    global_model: Literal["prototypes", "mean_classifier", "none"] = Field(
        "prototypes",
        description="global model: shared layers + nearest-global-prototype layer, or + mean classifier; or none",
    )


# --- the model split ---------------------------------------------------------------------------


def shared_keys(model: SplitModel) -> list[str]:
    """Every state_dict key but the final classifier's: what the server averages."""
    personal = set(model.classifier_keys())
    return [k for k in model.state_dict() if k not in personal]


def _head_prefix(model: SplitModel) -> list[nn.Module]:
    """The head's layers before the classifier (shared ones), in order."""
    head, last = model.head, model.classifier
    if head is last:
        return []
    layers = list(head.children()) if isinstance(head, nn.Sequential) else []
    if not layers or layers[-1] is not last:
        raise ValueError("GLDP needs a head that is the classifier or an nn.Sequential ending in it")
    return layers[:-1]


def shared_part(model: SplitModel) -> nn.Module:
    """The shared layers as one module (the model's own modules, no copies), to freeze or train."""
    return nn.ModuleList([model.body, *_head_prefix(model)])


def representation(model: SplitModel, features: torch.Tensor) -> torch.Tensor:
    """z = φ(x), the classifier's input, from the body's output."""
    for layer in _head_prefix(model):
        features = layer(features)
    return features


def embed(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
    return representation(model, model.features(x))


# --- prototypes ----------------------------------------------------------------------------------


def representation_statistics(
    model: SplitModel, dataset: Dataset, index: torch.Tensor, batch_size: int = 128
) -> ClassStats:
    """Per-class statistics of z on ``dataset.train[index]``, in inference mode (mode restored)."""
    stats = ClassStats.zeros(model.num_classes, model.classifier.in_features, index.device)
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for batch in index.split(batch_size):
            x, y = dataset.batch(dataset.train, batch)
            stats.add(embed(model, x), y)
    model.train(was_training)
    return stats


def moving_average(
    old: torch.Tensor | None,
    old_present: torch.Tensor | None,
    new: torch.Tensor,
    new_present: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """c ← β·c_new + (1−β)·c_old where both exist, c_new for new classes, c_old for the rest."""
    if old is None or old_present is None:
        return torch.where(new_present.unsqueeze(1), new, torch.zeros_like(new)), new_present.clone()
    both = (old_present & new_present).unsqueeze(1)
    mixed = torch.where(both, beta * new + (1 - beta) * old, torch.where(new_present.unsqueeze(1), new, old))
    return mixed, old_present | new_present


# --- losses --------------------------------------------------------------------------------------


def prototype_log_probs(z: torch.Tensor, protos: torch.Tensor, tau: float, relation: str = "cosine") -> torch.Tensor:
    """log p(j|x) = log softmax_j(cos(z, c_j)/τ) over the rows of ``protos`` (distance: −‖z − c_j‖²/τ)."""
    if relation == "distance":  # unbounded in the features' scale: kept for comparison only
        scores = -(z.unsqueeze(1) - protos.unsqueeze(0)).pow(2).sum(2)
    else:
        scores = F.normalize(z, dim=1) @ F.normalize(protos, dim=1).T
    return F.log_softmax(scores / tau, dim=1)


def relation_loss(
    z_old: torch.Tensor, z: torch.Tensor, protos: torch.Tensor, tau: float, relation: str = "cosine"
) -> torch.Tensor:
    """L_LPR = KL(p(·|z_old) ‖ p(·|z)) with the old prototypes, mean over the batch."""
    teacher = prototype_log_probs(z_old, protos, tau, relation)
    return F.kl_div(prototype_log_probs(z, protos, tau, relation), teacher, log_target=True, reduction="batchmean")


def glpr_class_weights(counts: torch.Tensor, weighting: str = "inverse_frequency") -> torch.Tensor:
    """w_j = n_k / (J_k · n_k^j) for the classes present (0 elsewhere), or 1 for ``none``."""
    if weighting == "none":
        return torch.ones(len(counts), device=counts.device)
    present = counts > 0
    n, classes = float(counts.sum()), int(present.sum())
    w = torch.zeros(len(counts), device=counts.device)
    w[present] = n / (classes * counts[present].to(torch.float32))
    return w


def weighted_target_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    targets: torch.Tensor,
    present: torch.Tensor,
    weights: torch.Tensor,
    alignment: Alignment = "mse",
) -> torch.Tensor:
    """L_GLPR = Σ_i w_{y_i} ‖z_i − C^{y_i}‖² / (B·d) (mse) or / B (l2sq); labels without a target add 0.

    With w ≡ 1 this is :func:`fedtail.algorithms.prototypes.class_target_loss`.
    """
    w = (weights[labels] * present[labels]).to(z.dtype).unsqueeze(1)
    sq = (z - targets[labels]).pow(2) * w
    return sq.sum() / (z.numel() if alignment == "mse" else z.shape[0])


def gldp_loss(
    opts: GLDPConfig,
    glpr: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    lpr: tuple[SplitModel, torch.Tensor] | None,
) -> FeatureLoss:
    """λ·L_LPR + (1−λ)·L_GLPR, for ``ctx.train(hook=FeatureTerm(...))``.

    ``glpr``: (global prototypes, their mask, class weights); ``lpr``: (the model holding the
    previous stage's shared layers, the old local prototypes of the classes that have one).
    """

    def term(model, x, y, logits, features):
        z = representation(model, features)
        total = z.new_zeros(())
        if glpr is not None:
            total = total + (1 - opts.lam) * weighted_target_loss(z, y, *glpr, opts.alignment)
        if lpr is not None:
            old, protos = lpr
            with torch.no_grad():
                z_old = embed(old, x)
            total = total + opts.lam * relation_loss(z_old, z, protos, opts.tau, opts.relation)
        return total

    return term


# --- server --------------------------------------------------------------------------------------


def prototype_layer(protos: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of a linear layer whose argmax is the nearest prototype (in squared L2).

    Logits 2 z·C^j/d − ‖C^j‖²/d = −‖z − C^j‖²/d + ‖z‖²/d: FedProto's scores up to a per-sample
    shift, so the same argmax and the same softmax.
    """
    d = protos.shape[1]
    weight = torch.where(present.unsqueeze(1), 2 * protos / d, torch.zeros_like(protos))
    bias = torch.where(present, -protos.pow(2).sum(1) / d, torch.full_like(present, ABSENT_BIAS, dtype=protos.dtype))
    return weight, bias


class GLDPServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        model = ctx.model()
        self.shared: Tensors = {k: ctx.init_weights[k] for k in shared_keys(model)}
        self.classifier: Tensors = {k: ctx.init_weights[k] for k in model.classifier_keys()}  # the global model's
        self.protos: torch.Tensor | None = None
        self.present: torch.Tensor | None = None

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: GLDPConfig = self.ctx.options
        out = self.shared | global_prototypes(self.protos, self.present)
        shared, protos, heads = WeightedMean(), ClassMean("uniform"), WeightedMean()
        for _, reply in comm.stream({cid: Message("fit", out) for cid in clients}):
            t = reply.tensors
            weight = 1.0 if opts.shared_weighting == "uniform" else reply.num_examples
            shared.add({k: t[k] for k in self.shared}, weight)
            protos.add(t[MEANS], t[PRESENT].long())
            if opts.global_model == "mean_classifier":
                heads.add({k: t[k] for k in self.classifier}, 1.0)
        self.shared = shared.result()
        means, present = protos.result()
        beta = opts.beta if opts.global_beta is None else opts.global_beta
        self.protos, self.present = moving_average(self.protos, self.present, means, present, beta)
        if opts.global_model == "mean_classifier":
            self.classifier = heads.result()
        comm.log(gldp_classes=int(self.present.sum()))

    def evaluation_message(self, cid: int) -> Message:
        return Message("evaluate", self.shared | global_prototypes(self.protos, self.present))

    def global_weights(self) -> Tensors | None:
        opts: GLDPConfig = self.ctx.options
        if opts.global_model == "none":
            return None
        if opts.global_model == "prototypes" and self.protos is not None:
            weight_key, bias_key = self.ctx.model().classifier_keys()  # (weight, bias), state_dict order
            weight, bias = prototype_layer(self.protos, self.present)
            return self.shared | {weight_key: weight, bias_key: bias}
        return self.shared | self.classifier


# --- client --------------------------------------------------------------------------------------


def held_classes(ctx: ClientContext) -> torch.Tensor:
    """(C,) mask of the classes the client holds: its seen stages' classes, else its training labels."""
    held = torch.zeros(ctx.num_classes, dtype=torch.bool, device=ctx.device)
    seen = ctx.data.seen_classes
    if seen is not None:
        held[seen] = True
    else:
        held[ctx.dataset.train.y[ctx.data.train].unique()] = True
    return held


class GLDPClient(ClientHalf):
    """State: ``classifier``, ``protos``/``present`` (local prototypes), ``stage``, and with stage
    tasks ``shared`` (its latest trained shared layers) and ``old_*`` (those of its previous stage)."""

    def _load(self, msg: Message, ctx: ClientContext) -> SplitModel:
        """The received shared layers with this client's classifier (first time: the initial one)."""
        model = ctx.model()
        classifier = ctx.state.get("classifier")
        if classifier is None:
            classifier = {k: ctx.init_weights[k] for k in model.classifier_keys()}
        shared = {k: v for k, v in msg.tensors.items() if k not in (MEANS, PRESENT)}
        return ctx.load(shared | classifier)

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: GLDPConfig = ctx.options
        state = ctx.state
        if "stage" in state and state["stage"] != ctx.stage and "shared" in state:
            # First round of another stage task: what the client ended its previous one with.
            state["old_shared"] = state.pop("shared")
            state["old_protos"], state["old_present"] = state["protos"].clone(), state["present"].clone()
        model = self._load(msg, ctx)
        train_only(ctx, model.classifier, shared_part(model), opts.head_epochs)
        train_only(ctx, shared_part(model), model.classifier, opts.body_epochs, hook=FeatureTerm(self._loss(msg, ctx)))

        state["classifier"] = ctx.weights(keys=model.classifier_keys())
        shared = ctx.weights(keys=shared_keys(model))
        if uses_lpr(opts) and ctx.workspace.config.plan.has_later_stage(ctx.rnd):
            state["shared"] = shared  # L_LPR's φ_old, should this turn out to be the stage's last round
        state["stage"] = ctx.stage
        stats = representation_statistics(model, ctx.dataset, ctx.data.train)
        state["protos"], state["present"] = moving_average(
            state.get("protos"), state.get("present"), stats.means, stats.present, opts.beta
        )
        out = shared | {MEANS: state["protos"], PRESENT: state["present"]}
        if opts.global_model == "mean_classifier":
            out |= state["classifier"]
        return ctx.reply(out)

    def _loss(self, msg: Message, ctx: ClientContext) -> FeatureLoss | None:
        """λ·L_LPR + (1−λ)·L_GLPR, or None where both are off (round 1, stage 0, λ at an end)."""
        opts: GLDPConfig = ctx.options
        glpr = None
        target = prototype_payload(msg)
        if target is not None and opts.glpr and opts.lam < 1:
            labels = ctx.dataset.train.y[ctx.data.train]
            weights = glpr_class_weights(class_counts(labels, ctx.num_classes), opts.glpr_weighting)
            glpr = (*target, weights)
        lpr = None
        if "old_shared" in ctx.state and uses_lpr(opts) and bool(ctx.state["old_present"].any()):
            old = ctx.load(ctx.state["old_shared"], role=OLD_ROLE, strict=False)
            old.eval()  # a fixed teacher: no dropout, BatchNorm running statistics
            lpr = (old, ctx.state["old_protos"][ctx.state["old_present"]])
        return None if glpr is None and lpr is None else gldp_loss(opts, glpr, lpr)

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        opts: GLDPConfig = ctx.options
        model = self._load(msg, ctx)
        return ctx.evaluate(predict=prediction(model, msg, ctx), main=PREDICT_NAMES[opts.predict])


# ``predict`` option -> the name of its accuracy among the evaluation's named accuracies
PREDICT_NAMES = {"global": "gp", "local": "lp", "head": "head"}


def uses_lpr(opts: GLDPConfig) -> bool:
    return opts.lpr and opts.lam > 0


def usable_prototypes(
    target: tuple[torch.Tensor, torch.Tensor] | None, held: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The prototypes and the mask of the held classes that have one; None where none has (decided
    once per evaluation, not per batch)."""
    if target is None:
        return None
    protos, present = target
    usable = present & held
    return (protos, usable) if bool(usable.any()) else None



def prediction(
    model: SplitModel, msg: Message, ctx: ClientContext
) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    """The three named scores of one pass: ``gp`` / ``lp``, the nearest global / local prototype
    among the held classes (the classifier's scores where none of them has one), ``head``."""
    held = held_classes(ctx)
    local_target = (ctx.state["protos"], ctx.state["present"]) if "protos" in ctx.state else None
    usable_global = usable_prototypes(prototype_payload(msg), held)
    usable_local = usable_prototypes(local_target, held)

    def scores(x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = embed(model, x)
        head = model.classifier(z)
        gp = head if usable_global is None else nearest_prototype_scores(z, *usable_global)
        lp = head if usable_local is None else nearest_prototype_scores(z, *usable_local)
        return {"gp": gp, "lp": lp, "head": head}

    return scores


GLDP = Algorithm(
    name="gldp",
    summary="GLDP (STHFL): shared layers averaged, personal classifier; global/local prototype losses and prediction",
    server=GLDPServer,
    client=GLDPClient,
    config=GLDPConfig,
    why_not={"segmentation": "its global-local prototypes and prototype prediction are of flat per-sample features"},
    robust=True,
    dp="also uploads class prototypes, which are not updates of the model sent",
)
