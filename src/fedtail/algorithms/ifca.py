"""IFCA: the Iterative Federated Clustering Algorithm.

Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated Learning",
NeurIPS 2020 (Algorithm 2, the model-averaging variant). The server keeps K cluster models
θ_1..θ_K and sends all of them to every sampled client i ∈ S_t. The client estimates its cluster

    ĵ_i = argmin_{j∈[K]} F_i(θ_j)          (F_i: mean cross-entropy on i's training data)

trains θ_ĵ for the run's E local epochs, giving θ̃_i, and returns θ̃_i with ĵ_i. The server
averages within each cluster,

    θ_j ← Σ_{i∈S_t: ĵ_i=j} p_i · θ̃_i / Σ_{i∈S_t: ĵ_i=j} p_i,

with p_i = n_i, the sample counts as FedAvg weights them (``weighting = "samples"``), or p_i = 1,
the plain mean of the members (``"uniform"``, as the authors' code averages), and a cluster nobody picked this round keeps its model. There is one shared model per cluster and
no personal model: a client is evaluated (sampled or not, at any time) with the cluster model of
lowest loss on its training data, the same argmin rule as in training (never its test data,
which stays unseen). The known cost is the downlink, K models per sampled client, metered as such.

Interpretations where the paper is silent (options, or noted here):

- ``init``: the paper's experiments start the K models from random initialisations (with
  several restarts, of which this runs one): ``random``. Cluster 0 is the run's common initial
  model and clusters 1..K−1 are fresh initialisations of the same architecture, seeded from the
  run seed; so K = 1 is FedAvg exactly. ``common`` starts every cluster from the common initial
  model instead.
- Ties in the loss (exact, as with identical models under ``common``) are broken uniformly at
  random from the client's stream, so identical starting models still split the clients;
  without ties no random number is drawn. A single model is taken without computing its loss.
- The client reports ĵ as the reply metric ``choice``; under ``weighting = "samples"`` the
  weights are the clients' training-set sizes, as in FedAvg. ``samples`` is the option's default
  (the behaviour before the option existed, so stored runs read the same); a new run gets the
  reference's ``uniform`` (``fedtail list``).

Missing replies (``--dropout``, rejected replies): each cluster averages the replies that chose
it; a cluster none of the replying clients chose keeps its model, as one nobody picked. The
``clustering`` log lists the clients that replied.

Devices: the server only averages (on the CPU); each client's loss of the K models runs on
``ctx.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field

from fedtail.algorithms.aggregate import PER_CLUSTER, WeightedMean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, Comm, Message, Reference, ServerHalf, Tensors
from fedtail.algorithms.clustering import cluster_record, flatten, float_keys, full_record
from fedtail.models import build_model

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext


class IFCAConfig(AlgorithmConfig):
    num_clusters: int = Field(2, ge=1, description="K: number of cluster models")
    init: Literal["random", "common"] = Field(
        "random",
        description="cluster models start as independent random initialisations (cluster 0: the run's "
        "initial model) or all as the run's initial model (ties broken at random)",
    )
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="cluster average weighted by training-set size, or the plain mean of the members"
    )


# --- several models in one message -----------------------------------------------------------


def pack_models(models: list[Tensors], kind: str = "fit") -> Message:
    """One message carrying ``models`` as ``"{k}/{name}"`` tensors, their number in the config."""
    tensors = {f"{k}/{name}": value for k, model in enumerate(models) for name, value in model.items()}
    return Message(kind, tensors, config={"models": len(models)})


def unpack_models(msg: Message) -> list[Tensors]:
    """The models of a :func:`pack_models` message (a plain message is one model)."""
    count = int(msg.config.get("models", 0))
    if count == 0:
        return [msg.tensors]
    models: list[Tensors] = [{} for _ in range(count)]
    for key, value in msg.tensors.items():
        k, name = key.split("/", 1)
        models[int(k)][name] = value
    return models


def lowest_loss(ctx: ClientContext, models: list[Tensors]) -> int:
    """ĵ = argmin_j F_i(θ_j) over this client's training data; exact ties broken at random."""
    if len(models) == 1:
        return 0
    losses = []
    for model in models:
        ctx.load(model)
        losses.append(ctx.train_loss())
    best = min(losses)
    tied = [j for j, loss in enumerate(losses) if loss == best]
    if len(tied) == 1:  # the usual case: draw nothing, so the training stream is untouched
        return tied[0]
    return tied[int(torch.randint(len(tied), (1,), generator=ctx.generator, device=ctx.generator.device))]


# --- initial cluster models (shared with FeSEM) ------------------------------------------------


def random_init_weights(ctx: ServerContext, k: int) -> Tensors:
    """A fresh random initialisation of the run's architecture, seeded by (run seed, k), drawn on
    the CPU (as the run's initial model) whatever the compute device."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # leave the caller's random stream untouched
        torch.manual_seed(ctx.seed(0xC1A5, k))
        model = build_model(ctx.config.model, ctx.dataset.input_shape, ctx.num_classes, ctx.config.head)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def initial_cluster_models(ctx: ServerContext, count: int, random: bool) -> list[Tensors]:
    """Model 0 is the run's common initial model; the others random (``random``) or copies of it."""
    first = dict(ctx.init_weights)
    return [first] + [random_init_weights(ctx, k) if random else dict(first) for k in range(1, count)]


# --- the two halves ----------------------------------------------------------------------------


class IFCAServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: IFCAConfig = ctx.options
        self.models: list[Tensors] = initial_cluster_models(ctx, opts.num_clusters, opts.init == "random")

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        message = pack_models(self.models)
        keys = float_keys(self.models[0])
        full = full_record(self.ctx.config, rnd)
        means: dict[int, WeightedMean] = {}
        cids, choices, points = [], [], []
        for cid, reply in comm.stream({cid: message for cid in clients}):
            j = int(reply.metrics["choice"])
            weight = reply.num_examples if self.ctx.options.weighting == "samples" else 1.0
            means.setdefault(j, WeightedMean()).add(reply.tensors, weight)
            cids.append(cid)
            choices.append(j)
            if full:  # only the log's 2-D view needs the uploads kept
                points.append(flatten(reply.tensors, keys))
        for j, mean in means.items():  # clusters nobody picked keep their model
            self.models[j] = mean.result()
        comm.log(clustering=cluster_record(cids, choices, torch.stack(points) if full else None, full=full))

    def evaluation_message(self, cid: int) -> Message:
        # every client gets all K models and adopts the one of lowest training loss
        return pack_models(self.models, kind="evaluate")


class IFCAClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        models = unpack_models(msg)
        choice = lowest_loss(ctx, models)
        ctx.load(models[choice])
        ctx.train()
        return ctx.reply(ctx.weights(), choice=float(choice))

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        models = unpack_models(msg)
        ctx.load(models[lowest_loss(ctx, models)])
        return ctx.evaluate()


IFCA = Algorithm(
    name="ifca",
    summary="IFCA (Ghosh et al. 2020): K cluster models; clients pick the one of lowest loss, averaged per cluster",
    server=IFCAServer,
    client=IFCAClient,
    config=IFCAConfig,
    reference=Reference("the authors' code (jichan3751/ifca)", options={"weighting": "uniform"}),
    tasks=("classification", "segmentation"),
    robust=PER_CLUSTER,
)
