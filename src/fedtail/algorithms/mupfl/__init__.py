"""MuPFL: Multi-level personalised FL for non-IID, long-tailed data.

Zhang et al., "Multi-level Personalized Federated Learning on Heterogeneous and Long-Tailed
Data", IEEE TMC 2024 (mupfl.txt, Sec. 3.3–3.5, Algorithm 1). One round, for sampled client i:

1. PKCF pre-training (Eq. 21): the client starts from the global body with its own classifier
   (the global one the first time) and trains the classifier τ epochs on the server's
   federated features h_glo. This is w_i^(t−1).
2. Local training with BAVD (Eq. 6, :mod:`.bavd`) for E epochs: w_i^t, Δw_i = w_i^t − w_i^(t−1).
   The client keeps w_i^t as its personalised model and computes per-class classifier
   gradients z_i^k on real features (Eq. 16); it uploads w_i^t, Δw_i, its map M_i and z_i.
3. ACMU at the edge servers (Eq. 7–14, :mod:`.acmu`): cluster, in-cluster update w̃_i, and
   forward Σ n_i·w̃_i; the server's sample-weighted mean is the global model (Eq. 15).
4. PKCF at the server (Eq. 17–20): per-class mean of z over the clients holding the class;
   the federated features are optimised so the global classifier's gradients on them match
   in cosine distance (shared with CReFF: :mod:`fedtail.algorithms.federated_features`).
   As Algorithm 1 has it, z_i comes from the client's model after local training while the
   matching uses the new global classifier; CReFF instead uses one classifier on both sides.

Personalised accuracy evaluates each client's own model (w_i^t of its last round), or the
global model for a client never sampled. Interpretations where the paper is silent (each
named option): the map is per position C×H×W and ψ's sign is ``psi_sign``; Δw is measured
from the model after PKCF pre-training; the whole head is the "local classifier" kept by the
client; Dist is a similarity, so the silhouette uses 1 − Dist. Ablations of Table VI:
``--set mupfl.bavd=false`` (plain training; ACMU then compares updates only),
``mupfl.acmu=false`` (w̃_i = w_i: plain weighted mean), ``mupfl.pkcf=false``.

Missing replies (``--dropout``, rejected replies): each edge clusters and reduces the replies it
received (:mod:`.acmu`); an edge none of whose clients replied forwards nothing, and the global
model is the weighted mean over the edges that forwarded. PKCF averages the gradients of the
replying holders of each class; a class none of them holds keeps its features. A client that did
not reply keeps its personal model and its BAVD map.
"""

from __future__ import annotations

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
from fedtail.algorithms.mupfl.acmu import cluster_clients, cluster_update, embedding, project_2d
from fedtail.algorithms.mupfl.bavd import ActivationMaps, activation_modules

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext

# Reply / forward tensor names besides the model's own keys.
DELTA = "delta/"
MAP = "bavd/map"
GRAD = "pkcf/grad."  # + "weight" / "bias" / "classes" (client upload: present classes only)
PRESENT = "pkcf/present"  # edge forward: per class, how many of the edge's clients hold it
FEATURES, LABELS = "pkcf/features", "pkcf/labels"


class MuPFLConfig(AlgorithmConfig):
    bavd: bool = Field(True, description="BAVD dropout in local training (Sec. 3.3)")
    acmu: bool = Field(True, description="ACMU clustering at the edge tier (Sec. 3.4)")
    pkcf: bool = Field(True, description="PKCF classifier pre-training on federated features (Sec. 3.5)")
    bavd_layers: list[int] | None = Field(
        None, description="indices of the body's activation layers followed by BAVD (None: all)"
    )
    psi_sign: Literal[1, -1] = Field(1, description="ψ = sign·(ℓ(λ) − ℓ(λ−1)); +1 is Eq. 6 as written")
    bavd_rescale: bool = Field(False, description="divide kept activations by the kept fraction (inverted dropout)")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the update term in Dist (Eq. 8)")
    kappa: int | None = Field(None, ge=1, description="fixed number of clusters (Table V); None: adaptive")
    kappa_min: int = Field(2, ge=2)
    kappa_max: int = Field(6, ge=2)
    num_features: int = Field(100, ge=1, description="m: federated features per class")
    tau: int = Field(100, ge=0, description="τ: classifier pre-training epochs on the features")
    pkcf_lr: float = Field(0.01, gt=0)
    pkcf_batch: int = Field(32, ge=1)
    match_iterations: int = Field(100, ge=1, description="feature-matching SGD steps per round")
    match_lr: float = Field(0.1, gt=0, description="feature-matching lr (CReFF's 0.1; see creff.py on feature size)")
    feature_init_std: float = Field(1.0, gt=0, description="std of the features' initial N(0, σ²) draw (CReFF's 1)")

    @model_validator(mode="after")
    def _range(self) -> "MuPFLConfig":
        if self.kappa_min > self.kappa_max:
            raise ValueError(f"kappa_min ({self.kappa_min}) must not exceed kappa_max ({self.kappa_max})")
        return self


class MuPFLServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.weights: Tensors = dict(ctx.init_weights)
        opts: MuPFLConfig = ctx.options
        model = ctx.model()
        self.features: FederatedFeatures | None = None
        if opts.pkcf:
            generator = torch.Generator().manual_seed(ctx.seed(0xFEA7))
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

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        tensors = dict(self.weights)
        if self.features is not None and self.matched:
            tensors |= {FEATURES: self.features.features, LABELS: self.features.labels}
        forwarded = comm.exchange_via_edges({cid: Message("fit", tensors) for cid in clients})

        mean = WeightedMean()
        grad_sum: Tensors = {}
        holders: torch.Tensor | None = None
        records = []
        full = full_record(self.ctx.config, rnd)
        for edge_id, by_key in forwarded.items():
            msg = by_key[edge_id]
            mean.add({k: msg.tensors[k] for k in self.weights}, msg.metrics["weight"])
            records.append(_acmu_record(edge_id, msg, full))
            if self.features is not None:
                for part in ("weight", "bias"):
                    g = msg.tensors[GRAD + part]
                    grad_sum[part] = grad_sum[part] + g if part in grad_sum else g.clone()
                holders = msg.tensors[PRESENT] if holders is None else holders + msg.tensors[PRESENT]
        self.weights = mean.result()
        logs: dict = {"acmu": records}
        if self.features is not None and holders is not None:
            present = holders > 0
            count = holders.clamp_min(1)
            real = {k: g / count.reshape(-1, *([1] * (g.dim() - 1))) for k, g in grad_sum.items()}
            model = self.ctx.model()
            model.load_state_dict(self.weights)
            before, after = self.features.match(model.classifier, real, present)
            self.matched = True
            logs["pkcf_match"] = [before, after]
        comm.log(**logs)

    def global_weights(self) -> Tensors:
        return self.weights

    def state_dict(self) -> dict:
        state = {"weights": self.weights, "matched": self.matched}
        if self.features is not None:
            state["features"] = self.features.state_dict()
        return state

    def load_state_dict(self, state) -> None:
        self.weights, self.matched = state["weights"], state["matched"]
        if self.features is not None:
            self.features.load_state_dict(state["features"])


def _acmu_record(edge_id: int, msg: Message, full: bool) -> dict:
    """An edge's ACMU log entry; the assignment and the 2-D view only in a full record (``log_clustering_every``)."""
    record = {"edge": edge_id, "kappa": int(msg.metrics["kappa"]), "silhouette": msg.metrics["silhouette"]}
    if not full:
        return record
    return record | {
        "clients": msg.tensors["acmu/clients"].tolist(),
        "clusters": msg.tensors["acmu/clusters"].tolist(),
        "pca": [[round(x, 5), round(y, 5)] for x, y in msg.tensors["acmu/pca"].tolist()],
    }


class ACMUEdge(EdgeHalf):
    """An edge server: clusters its clients' updates and forwards one aggregate (Eq. 14–15)."""

    def reduce(self, edge_id: int, replies: dict[int, Message]) -> dict[int, Message]:
        opts: MuPFLConfig = self.ctx.options
        cids = sorted(replies)
        model_keys = [k for k in replies[cids[0]].tensors if "/" not in k]
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
        sizes = [replies[c].metrics["num_examples"] for c in cids]
        for w, n in zip(updated, sizes):
            mean.add(w, n)
        tensors = mean.result() | {
            "acmu/clients": torch.tensor(cids),
            "acmu/clusters": torch.as_tensor(labels),
            "acmu/pca": torch.as_tensor(project_2d(points)),
        }
        if opts.pkcf:  # per-class sums and holder counts; the server divides (Eq. 17)
            for c in cids:
                grads, present = unpack_class_gradients(replies[c].tensors, self.ctx.num_classes, prefix=GRAD)
                for part, g in grads.items():
                    tensors[GRAD + part] = tensors[GRAD + part] + g if GRAD + part in tensors else g
                tensors[PRESENT] = tensors.get(PRESENT, 0) + present.to(torch.float32)
        metrics = {"weight": float(sum(sizes)), "kappa": float(kappa), "silhouette": float(silhouette)}
        return {edge_id: Message("edge", tensors, metrics=metrics)}


class MuPFLClient(PersonalClient):
    def _layers(self, ctx: ClientContext) -> list[int]:
        opts: MuPFLConfig = ctx.options
        if opts.bavd_layers is not None:
            return opts.bavd_layers
        return list(range(len(activation_modules(ctx.model().body))))

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: MuPFLConfig = ctx.options
        model = ctx.model()
        global_weights = {k: v for k, v in msg.tensors.items() if "/" not in k}
        ctx.load(global_weights)
        personal = ctx.state.get("personal")
        if personal is not None:  # the client's own classifier on the global body
            ctx.load({k: personal[k] for k in model.head_keys()}, strict=False)
        if opts.pkcf and FEATURES in msg.tensors and opts.tau > 0:
            train_classifier(
                model.classifier,
                msg.tensors[FEATURES],
                msg.tensors[LABELS],
                epochs=opts.tau,
                batch_size=opts.pkcf_batch,
                lr=opts.pkcf_lr,
                generator=ctx.generator,
            )
        start = ctx.weights()

        maps = ActivationMaps.from_state(
            self._layers(ctx), float(opts.psi_sign), ctx.state.get("bavd"), opts.bavd_rescale
        )
        if opts.bavd:
            with maps.attached(model):
                ctx.train(on_step=maps.on_step)
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
            grads, present = class_gradients(model, ctx.dataset, ctx.data.train, ctx.num_classes, ctx.generator)
            tensors |= pack_class_gradients(grads, present, prefix=GRAD)
        return ctx.reply(tensors)


MUPFL = Algorithm(
    name="mupfl",
    summary="MuPFL (Zhang et al. 2024): BAVD dropout, ACMU edge clustering, PKCF classifier pre-training",
    server=MuPFLServer,
    client=MuPFLClient,
    config=MuPFLConfig,
    edge=ACMUEdge,
)
