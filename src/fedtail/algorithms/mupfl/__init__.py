"""MuPFL: Multi-level personalised FL for non-IID, long-tailed data.

Zhang et al., "Multi-level Personalized Federated Learning on Heterogeneous and Long-Tailed
Data", IEEE TMC 2024 (the MuPFL paper, Sec. 3.3–3.5, Algorithm 1). One round t, sampled clients S_t:

1. Local training with BAVD (Eq. 6, :mod:`.bavd`) for E epochs from the client's starting
   model w_i^(t−1) (see *reading*): w_i^t and Δw_i = w_i^t − w_i^(t−1) (Eq. 7). The client
   also computes per-class classifier gradients z_i^k on real features (Eq. 16) and uploads
   w_i^t, Δw_i, its map M_i and z_i.
2. ACMU at the edge servers (Eq. 8–14, :mod:`.acmu`): Dist(i, j) = α·cos(Δw_i, Δw_j) +
   (1 − α)·cos(M_i, M_j), k-means for κ ∈ [κ_min, κ_max] chosen by the silhouette, then
   w̃_i = w_i^(t−1) + (1/|C_l|) Σ_{j∈C_l} Δw_j (Eq. 14); the server's sample-weighted mean of
   the w̃_i is the global model w_global = Σ (n_i/n)·w̃_i (Eq. 15).
3. PKCF at the server (Eq. 17–20): per-class mean of z over the clients holding the class;
   m federated features per class are optimised so the global classifier's gradients on them
   match in cosine distance (shared with CReFF: :mod:`fedtail.algorithms.federated_features`).
   A client trains its classifier τ epochs on them (Eq. 21; see *PKCF order*).

**Reading** (``reading``, issue 16). ``"personal"`` (an option; validation rejected it, see the
defaults below): each client keeps a personal
model, starts its local training from it, and Eq. 14's w̃_i becomes that model; the global
model of Eq. 15 is only the starting model of clients never sampled (and PKCF's classifier).
The sentences that decide: Algorithm 1 line 6, "w_i^(t) ← CLIENTUPDATE(k, D_i, M_i0,
w_i^(t−1))" (the client's own previous model, not w_global^(t−1)); line 29 / Eq. 14,
"w̃_i^(t) = w_i^(t−1) + (1/|C_l|) Σ Δw_κ^(t)", "a more ideal updated local model w̃_i^(t)"
(Sec. 3.4); and the introduction's ACMU, "employing cosine similarity to guide cluster
formation for personalized model updates". Under the other reading a cluster's mean update
only reweights the updates FedAvg averages, so ACMU does not personalise at all (Table V's
flat κ row in ``benchmarks/mupfl/RESULTS_lr0.005.md``). ``"global-start"`` (the default, the reading
validation chose): a client starts from the global body with its own classifier and keeps its
trained w_i^t; w̃_i only feeds the average. It follows Sec. 3.5, "After classifier tuning,
client i will use the new parameters w_i^{t+1} = (u_i^{t+1}, v_glo^{t+1}) for local model
training" (own classifier, global rest). ``"global-start-acmu"`` joins the two sentences: a
client starts as in ``global-start`` (Sec. 3.5) but keeps Eq. 14's w̃_i as its model, the "more
ideal updated local model" of line 29, so the model evaluated after round t is its cluster's
mean update applied to the round's common start and its next start takes w̃_i's classifier.
Under the global start every participant's Δw is measured from the same body, so the body of
w̃_i is its cluster's model (clustered FL); under ``personal`` the cluster means updates from
different starting points.

How w̃_i reaches client i: in the same round. The edge returns each w̃_i beside its
aggregate, and the server sends it back in a second exchange (``personalise``, one message per
participant), so the model evaluated after round t is w̃_i^t and the client's next
CLIENTUPDATE starts from it, as Algorithm 1 line 6 asks. Keeping w̃_i on the server until the
client's next participation would evaluate w_i^t instead of w̃_i^t and would hold N models
on the server; the simulator has no edge → client link, so the server relays (the edge →
server bytes include the relayed models). With ``acmu = false`` w̃_i = w_i^t, which the
client already holds, so nothing is sent back. A client with a personal model is sent no
global model in ``fit`` (it would not use it).

**PKCF order** (``pkcf_order``). ``"after-aggregation"`` (an option; validation rejected it): Algorithm 1 runs PKCF after
the global update ("9: w_global^(t) ← Σ (n_i/n)·w̃_i^(t)", "10: PKCF(z_i)"), whose last step
is "return h_glo^{t+1} to selected clients ▷ On client Each client using h_glo^{t+1} to
pre-train local classifier". The round's participants receive the new features with their
w̃_i, train the classifier τ epochs, and keep that model: it is what is evaluated and what
their next local training starts from ("After classifier tuning, client i will use the new
parameters ... for local model training", Sec. 3.5). Sec. 4.5's τ study ("surpassing
approximately 100 training rounds overgeneralizes the classifier, diminishing its local
dataset recognition capability") only makes sense if the tuned classifier reaches the
evaluated model. ``"before-local"`` (the default, the order validation chose): the features
go out with the next ``fit`` ("the server distributes h_glo^{t+1} to selected clients for
local classifier tuning in the next round t+1") and the client tunes its classifier just
before its E local epochs, which train over the calibration before anything evaluates it
(``benchmarks/mupfl/README.md``, "PKCF order", measures how much of it remains).

Other interpretations where the paper is silent (each a named option): BAVD's mask, map,
shape, sign and rescaling (:mod:`.bavd`); Δw is measured from the model the local training
starts from (after PKCF tuning in the before-local order); the whole head is the "local
classifier" a global-start client keeps; Dist is a similarity, so the silhouette uses
1 − Dist. Ablations of Table VI: ``--set mupfl.bavd=false`` (plain training; ACMU then
compares updates only), ``mupfl.acmu=false`` (w̃_i = w_i: plain weighted mean; with the
personal reading each client then shares nothing but the federated features),
``mupfl.pkcf=false``.

**What acts under the default** (the configuration ``benchmarks/mupfl`` validated; its README,
"Choices the paper leaves open", holds every validation table):

- BAVD: does not act (``bavd = false``): no reading of Eq. 6 beat plain training by the margin on
  validation data; ``--set mupfl.bavd=true`` runs the best one (:mod:`.bavd` holds its readings).
- ACMU: acts only through the global body each client starts from (``reading = "global-start"``:
  its w̃_i reweight Eq. 15's average; the readings that evaluate w̃_i lost on validation data).
- PKCF: acts: each client tunes its classifier τ epochs on the federated features just before its
  local epochs (``pkcf_order = "before-local"``), so the evaluated model starts from that classifier.

Without BAVD there are no maps: ACMU's Dist (Eq. 8) compares updates only and α has no effect.

Real gradients (Eq. 16): taken after the local epochs with the client's own body f_i(u_i) and
classifier v_i, as Algorithm 1 computes z_i^k (lines 19–20) after its training loop (lines 15–18);
the server matches them under the new global classifier v_glo (Eq. 19). CReFF takes them before
local training, under the classifier the server matches with, as its authors' code does: each
follows its own paper and code (``creff.py``).

The other defaults: α 0.25, τ 50, κ ∈ [2, 6], m = 800 features per class (the paper gives no single
m; validation raised m until its best value lay inside the grid), N(0, 0.1²) features matched at
lr 100. A larger m costs PKCF's matching time about linearly (``benchmarks/feature_matching.py``).

Missing replies (``--dropout``, rejected replies): each edge clusters and reduces the replies it
received (:mod:`.acmu`); an edge none of whose clients replied forwards nothing, and the global
model is the weighted mean over the edges that forwarded. PKCF averages the gradients of the
replying holders of each class; a class none of them holds keeps its features. A client that did
not reply keeps its personal model and its BAVD map.

Devices: PKCF's feature matching runs on the server's compute device (the features come back to
the CPU after it); ACMU's clustering of the edge's n clients (cosine Gram matrix, k-means,
silhouettes) runs on the CPU, where the replies arrive; clients train on ``ctx.device``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Comm, EdgeHalf, Message, PersonalClient, ServerHalf, Tensors
from fedtail.algorithms.clustering import flatten, float_keys, full_record
from fedtail.algorithms.federated_features import (
    FederatedFeatures,
    class_gradients,
    pack_class_gradients,
    train_classifier,
    unpack_class_gradients,
)
from fedtail.algorithms.mupfl.acmu import cluster_clients, cluster_update, embedding, plain_kmeans, project_2d
from fedtail.algorithms.mupfl.bavd import ActivationMaps, activation_modules

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext

# Reply / forward tensor names besides the model's own keys.
DELTA = "delta/"
MAP = "bavd/map"
GRAD = "pkcf/grad."  # + "weight" / "bias" / "classes" (client upload: present classes only)
PRESENT = "pkcf/present"  # edge forward: per class, how many of the edge's clients hold it
FEATURES, LABELS = "pkcf/features", "pkcf/labels"
# edge upload of ACMU's clustering, for the server's log: its clients, their clusters, a 2-d PCA of their points
ACMU_CLIENTS, ACMU_CLUSTERS, ACMU_PCA = "acmu/clients", "acmu/clusters", "acmu/pca"
ACMU_KMEANS = "acmu/kmeans"  # plain k-means of the clients' models at the same κ (Fig. 10's "K-Means" panel)
AGGREGATE = -1  # an edge's aggregate among its forwards; the others are keyed by client id (>= 0)


class MuPFLConfig(AlgorithmConfig):
    reading: Literal["personal", "global-start", "global-start-acmu"] = Field(
        "global-start",
        description="personal: a client trains from its own model and keeps Eq. 14's w̃_i (Algorithm 1); "
        "global-start: from the global body with its own classifier, w̃_i only feeds the average; "
        "global-start-acmu: from the global body with its own classifier, and keeps w̃_i",
    )
    pkcf_order: Literal["after-aggregation", "before-local"] = Field(
        "before-local",
        description="after-aggregation: participants tune their classifier on the new features at the end of "
        "the round (Algorithm 1 line 10) and are evaluated on it; before-local: at their next fit, before training",
    )
    bavd: bool = Field(
        False, description="BAVD dropout in local training (Sec. 3.3); off by default: no reading of it beat plain "
        "training on validation data (module docstring)"
    )
    acmu: bool = Field(True, description="ACMU clustering at the edge tier (Sec. 3.4)")
    pkcf: bool = Field(True, description="PKCF classifier tuning on federated features (Sec. 3.5)")
    bavd_layers: list[int] | None = Field(
        default_factory=lambda: [-1],
        description="indices of the body's activation layers followed by BAVD (None: all; -1: the last)",
    )
    bavd_mask: Literal["map", "value"] = Field(
        "value", description="zero positions whose normalised map is below its mean (map), or activations whose "
        "own normalised value is (value); see bavd.py"
    )
    bavd_map: Literal["accumulated", "batch", "epoch", "round"] = Field(
        "epoch", description="the Eq. 6 map started again every local epoch (the best BAVD reading on validation "
        "data at lr 0.01), or every round, or accumulated over every step and round, or the mask from this batch alone (bavd.py)"
    )
    bavd_eval: bool = Field(
        False, description="at evaluation (and for PKCF's real gradients) mask with the client's stored map too, "
        "not rescaled (Sec. 3.1's variant that retains only high activations); off: the identity, as dropout"
    )
    bavd_map_shape: Literal["chw", "hw"] = Field("chw", description="one map value per C×H×W position, or per H×W")
    psi_sign: Literal[1, -1] = Field(-1, description="ψ = sign·(ℓ(λ) − ℓ(λ−1)); +1 is Eq. 6 as written")
    bavd_rescale: bool = Field(
        False, description="divide kept activations by the kept fraction (inverted dropout; cost 2.4 points at lr 0.01)"
    )
    alpha: float = Field(0.25, ge=0, le=1, description="weight of the update term in Dist (Eq. 8)")
    kappa: int | None = Field(None, ge=1, description="fixed number of clusters (Table V); None: adaptive")
    kappa_min: int = Field(2, ge=2)
    kappa_max: int = Field(6, ge=2)
    num_features: int = Field(
        800, ge=1, description="m: federated features per class (chosen on validation data: 100-1600; the paper "
        "gives no single m)"
    )
    tau: int = Field(50, ge=0, description="τ: classifier tuning epochs on the features")
    pkcf_lr: float = Field(0.01, gt=0)
    pkcf_batch: int = Field(32, ge=1)
    match_iterations: int = Field(100, ge=1, description="feature-matching SGD steps per round")
    match_lr: float = Field(100.0, gt=0, description="feature-matching lr (chosen on validation data; CReFF's is 0.1)")
    feature_init_std: float = Field(0.1, gt=0, description="std of the features' initial N(0, σ²) draw (CReFF's 1)")

    @model_validator(mode="after")
    def _range(self) -> "MuPFLConfig":
        if self.kappa_min > self.kappa_max:
            raise ValueError(f"kappa_min ({self.kappa_min}) must not exceed kappa_max ({self.kappa_max})")
        return self


def model_part(tensors: Tensors) -> Tensors:
    """The model's own entries of a payload (named tensors without a ``/``)."""
    return {k: v for k, v in tensors.items() if "/" not in k}


class MuPFLServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.weights: Tensors = dict(ctx.init_weights)
        opts: MuPFLConfig = ctx.options
        model = ctx.model()
        self.features: FederatedFeatures | None = None
        if opts.pkcf:
            generator = torch.Generator(device="cpu").manual_seed(ctx.seed(0xFEA7))
            self.features = FederatedFeatures(
                ctx.num_classes,
                model.classifier.in_features,
                opts.num_features,
                generator,
                lr=opts.match_lr,
                iterations=opts.match_iterations,
                init_std=opts.feature_init_std,
            )
        self.matched = False  # features are sent only once they carry knowledge
        # Clients whose fit was accepted hold a personal model; with the personal reading they
        # are sent no global model (they start from their own).
        self.personal_clients: list[int] = []

    def _features(self) -> Tensors:
        """The federated features for classifier tuning, once matched and if τ > 0 (else nothing)."""
        if self.features is None or not self.matched or self.ctx.options.tau == 0:
            return {}
        return {FEATURES: self.features.features, LABELS: self.features.labels}

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: MuPFLConfig = self.ctx.options
        known = set(self.personal_clients) if opts.reading == "personal" else set()
        before = self._features() if opts.pkcf_order == "before-local" else {}
        fit = {cid: Message("fit", ({} if cid in known else dict(self.weights)) | before) for cid in clients}
        forwarded = comm.exchange_via_edges(fit)

        mean = WeightedMean()
        grad_sum: Tensors = {}
        holders: torch.Tensor | None = None
        records = []
        full = full_record(self.ctx.config, rnd)
        personal: dict[int, Tensors] = {}  # Eq. 14's w̃_i per client (personal reading with ACMU)
        participants: list[int] = []  # the clients whose replies the edges reduced
        for edge_id, by_key in forwarded.items():
            msg = by_key[AGGREGATE]
            mean.add({k: msg.tensors[k] for k in self.weights}, msg.metrics["weight"])
            records.append(_acmu_record(edge_id, msg, full))
            participants += msg.tensors[ACMU_CLIENTS].tolist()
            personal |= {cid: m.tensors for cid, m in by_key.items() if cid != AGGREGATE}
            if self.features is not None:
                for part in ("weight", "bias"):
                    g = msg.tensors[GRAD + part]
                    grad_sum[part] = grad_sum[part] + g if part in grad_sum else g.clone()
                holders = msg.tensors[PRESENT] if holders is None else holders + msg.tensors[PRESENT]
        self.weights = mean.result()  # Eq. 15
        logs: dict = {"acmu": records}
        if self.features is not None and holders is not None:
            present = holders > 0
            count = holders.clamp_min(1)
            real = {k: g / count.reshape(-1, *([1] * (g.dim() - 1))) for k, g in grad_sum.items()}
            model = self.ctx.model()
            model.load_state_dict(self.weights)
            before_loss, after_loss = self.features.match(model.classifier, real, present)
            self.matched = True
            logs["pkcf_match"] = [before_loss, after_loss]

        participants = sorted(participants)
        after = self._features() if opts.pkcf_order == "after-aggregation" else {}
        followup = {cid: dict(personal.get(cid, {})) | after for cid in participants}
        followup = {cid: t for cid, t in followup.items() if t}
        if followup:
            comm.exchange({cid: Message("personalise", t) for cid, t in followup.items()})
        self.personal_clients = sorted(set(self.personal_clients) | set(participants))
        comm.log(**logs)

    def global_weights(self) -> Tensors:
        return self.weights

    def state_dict(self) -> dict:
        state = {"weights": self.weights, "matched": self.matched, "personal_clients": list(self.personal_clients)}
        if self.features is not None:
            state["features"] = self.features.state_dict()
        return state

    def load_state_dict(self, state) -> None:
        self.weights, self.matched = state["weights"], state["matched"]
        self.personal_clients = list(state["personal_clients"])
        if self.features is not None:
            self.features.load_state_dict(state["features"])


def _acmu_record(edge_id: int, msg: Message, full: bool) -> dict:
    """An edge's ACMU log entry; the assignment and the 2-D view only in a full record (``log_clustering_every``)."""
    record = {"edge": edge_id, "kappa": int(msg.metrics["kappa"]), "silhouette": msg.metrics["silhouette"]}
    if not full:
        return record
    return record | {
        "clients": msg.tensors[ACMU_CLIENTS].tolist(),
        "clusters": msg.tensors[ACMU_CLUSTERS].tolist(),
        "pca": [[round(x, 5), round(y, 5)] for x, y in msg.tensors[ACMU_PCA].tolist()],
        "kmeans": msg.tensors[ACMU_KMEANS].tolist(),
    }


class ACMUEdge(EdgeHalf):
    """An edge server: clusters its clients' updates and forwards one aggregate (Eq. 14–15).

    With the personal reading it also forwards each client's w̃_i (keyed by client id), which
    the server sends back to that client.
    """

    def reduce(self, edge_id: int, replies: dict[int, Message]) -> dict[int, Message]:
        opts: MuPFLConfig = self.ctx.options
        cids = sorted(replies)
        model_keys = list(model_part(replies[cids[0]].tensors))
        weights = [{k: replies[c].tensors[k] for k in model_keys} for c in cids]
        deltas = [{k: replies[c].tensors[DELTA + k] for k in model_keys} for c in cids]
        keys = float_keys(weights[0])
        flat = torch.stack([flatten(d, keys) for d in deltas])
        maps = torch.stack([replies[c].tensors[MAP] for c in cids]) if opts.bavd else None
        points = embedding(flat, maps, opts.alpha)
        if opts.acmu:
            found = cluster_clients(
                points,
                kappa=opts.kappa,
                kappa_min=opts.kappa_min,
                kappa_max=opts.kappa_max,
                seed=self.ctx.seed(edge_id, *cids) % 2**31,
            )
            labels, kappa, silhouette = found.labels, found.kappa, found.silhouette
            updated = cluster_update(weights, deltas, labels)
        else:  # ablation: no in-cluster update, w̃_i = w_i
            labels, kappa, silhouette = np.arange(len(cids)), len(cids), 0.0
            updated = weights
        mean = WeightedMean()
        sizes = [replies[c].num_examples for c in cids]
        for w, n in zip(updated, sizes):
            mean.add(w, n)
        tensors = mean.result() | {
            ACMU_CLIENTS: torch.tensor(cids, device="cpu"),
            ACMU_CLUSTERS: torch.as_tensor(labels, device="cpu"),
            ACMU_PCA: torch.as_tensor(project_2d(points), device="cpu"),
            ACMU_KMEANS: torch.as_tensor(plain_kmeans(weights, keys, kappa, self.ctx.seed(edge_id, *cids) % 2**31), device="cpu"),
        }
        if opts.pkcf:  # per-class sums and holder counts; the server divides (Eq. 17)
            for c in cids:
                grads, present = unpack_class_gradients(replies[c].tensors, self.ctx.num_classes, prefix=GRAD)
                for part, g in grads.items():
                    tensors[GRAD + part] = tensors[GRAD + part] + g if GRAD + part in tensors else g
                tensors[PRESENT] = tensors.get(PRESENT, 0) + present.to(torch.float32)
        metrics = {"weight": float(sum(sizes)), "kappa": float(kappa), "silhouette": float(silhouette)}
        out = {AGGREGATE: Message("edge", tensors, metrics=metrics)}
        if opts.reading != "global-start" and opts.acmu:  # without ACMU w̃_i = w_i: the client has it
            out |= {c: Message("personal", w) for c, w in zip(cids, updated)}
        return out


class MuPFLClient(PersonalClient):
    def _layers(self, ctx: ClientContext) -> list[int]:
        opts: MuPFLConfig = ctx.options
        if opts.bavd_layers is not None:
            return opts.bavd_layers
        return list(range(len(activation_modules(ctx.model().body))))

    def _tune(self, msg: Message, ctx: ClientContext) -> None:
        """PKCF on the client (Eq. 21): τ epochs of the classifier on the federated features."""
        opts: MuPFLConfig = ctx.options
        train_classifier(
            ctx.model().classifier,
            msg.tensors[FEATURES],
            msg.tensors[LABELS],
            epochs=opts.tau,
            batch_size=opts.pkcf_batch,
            lr=opts.pkcf_lr,
            generator=ctx.generator,
        )

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: MuPFLConfig = ctx.options
        model = ctx.model()
        personal = ctx.state.get("personal")
        if opts.reading == "personal" and personal is not None:
            ctx.load(personal)  # Algorithm 1 line 6: CLIENTUPDATE(..., w_i^(t−1))
        else:
            global_weights = model_part(msg.tensors)
            if not global_weights:
                raise ValueError("MuPFL fit without a model: the client holds no personal model either")
            ctx.load(global_weights)
            if personal is not None:  # global-start: the client's own classifier on the global body
                ctx.load({k: personal[k] for k in model.head_keys()}, strict=False)
        if opts.pkcf and FEATURES in msg.tensors:  # the before-local order
            self._tune(msg, ctx)
        start = ctx.weights()

        maps = self._maps(ctx)
        if opts.bavd:
            if opts.bavd_map == "round":
                maps.reset()  # CLIENTUPDATE starts from M_i0
            with maps.attached(model):
                ctx.train(hook=maps.hook(per_epoch=opts.bavd_map == "epoch"))
            ctx.state["bavd"] = maps.state()
        else:
            ctx.train()
        trained = ctx.weights()
        ctx.state["personal"] = trained

        tensors = dict(trained)
        tensors |= {DELTA + k: trained[k] - start[k] for k in trained}
        if opts.bavd:
            tensors[MAP] = maps.flat()
        if opts.pkcf:
            with self._masked(model, ctx, maps):  # the features the evaluated model's classifier sees
                grads, present = class_gradients(model, ctx.dataset, ctx.data.train, ctx.num_classes, ctx.generator,
                                                 labels=ctx.data.labels)
            tensors |= pack_class_gradients(grads, present, prefix=GRAD)
        return ctx.reply(tensors)

    def _maps(self, ctx: ClientContext) -> ActivationMaps:
        """The client's BAVD maps as its state holds them, under the run's reading."""
        opts: MuPFLConfig = ctx.options
        return ActivationMaps.from_state(
            self._layers(ctx),
            float(opts.psi_sign),
            ctx.state.get("bavd"),
            opts.bavd_rescale,
            mask=opts.bavd_mask,
            source=opts.bavd_map,
            shape=opts.bavd_map_shape,
            eval_mask=opts.bavd_eval,
        )

    def _masked(self, model: torch.nn.Module, ctx: ClientContext, maps: ActivationMaps | None = None):
        """The BAVD layers in ``model`` at evaluation (``bavd_eval``: the stored map's mask), else nothing."""
        opts: MuPFLConfig = ctx.options
        if not (opts.bavd and opts.bavd_eval):
            return nullcontext()
        return (maps or self._maps(ctx)).attached(model)

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        model = ctx.load(ctx.state.get("personal", self.start(msg, ctx)))
        with self._masked(model, ctx):
            return ctx.evaluate()

    def personalise(self, msg: Message, ctx: ClientContext) -> Message:
        """End of a round: adopt w̃_i (personal reading) and/or tune the classifier (after-aggregation)."""
        opts: MuPFLConfig = ctx.options
        ctx.load(model_part(msg.tensors) or ctx.state["personal"])
        if opts.pkcf and FEATURES in msg.tensors:
            self._tune(msg, ctx)
        ctx.state["personal"] = ctx.weights()
        return ctx.reply()


MUPFL = Algorithm(
    name="mupfl",
    summary="MuPFL (Zhang et al. 2024): BAVD dropout, ACMU edge clustering, PKCF classifier tuning. By default "
    "PKCF acts (each classifier tuned before local training), ACMU acts only through the global body (it "
    "reweights the average), BAVD is off",
    server=MuPFLServer,
    client=MuPFLClient,
    config=MuPFLConfig,
    edge=ACMUEdge,
    tasks=("classification", "segmentation"),
    robust="its edge tier reduces the replies per edge and ACMU reweights them before the mean",
)
