"""FedReMa: personalised classifiers aggregated over each client's most relevant peers.

Liang, Zhan, Liu, Zhang, Tan and Chen, "FedReMa: Improving Personalized Federated Learning via
Leveraging the Most Relevant Clients", ECAI 2024 (Sec. 4, Algorithms 1–2). The model is a
feature extractor θ (the body) and a classifier φ (the head: every FC layer, for ``cnn2fc`` FC
512 and the last FC, as the paper says and the authors' code splits it).
Round t, with the uploading clients K_t:

1. the server sends client k the shared body and its own head, w_k = {θ^{t−1}, φ_k^{t−1}};
   client k trains the whole model for the run's E epochs (SGD; momentum and clipping: the
   reference settings below) and uploads
   θ̂_k, φ̂_k and n_k;
2. body (Eq. 6):  θ^t = Σ_{k∈K_t} n_k θ̂_k / Σ_{k∈K_t} n_k, the same for every client;
3. soft logits: one random feature r ~ U[0, 1)^d (d = the head's input size) for all heads,
   p_k = softmax(φ̂_k(r) / M), and S = the cosine similarities of the p_k (Eq. 5);
4. while in the critical co-learning period (CCP), MDS (Alg. 1) on row s_k of S gives client k
   its relevant set A_k and largest gap Δs_k, and

       φ_k^t = Σ_{j∈A_k} w_j φ̂_j / Σ_{j∈A_k} w_j,   w_j = 1 ("uniform") or n_j ("samples", Eq. 7),
       G[k, j] += 1 for every j ∈ A_k;

   then the CCP check (Eq. 8–9): Δs̄^t = mean_{k∈K_t} Δs_k; the CCP ends for good the first
   round Δs̄^t / max_{τ≤t} Δs̄^τ < δ (that round still aggregated by MDS, as in Alg. 2);
5. after the CCP (Eq. 10):  φ_k^t = Σ_j G[k, j] φ̂_j / Σ_j G[k, j], with φ̂_j client j's most
   recent upload.

MDS (Alg. 1 as the authors' code runs it): sort s_k ascending, take the consecutive differences
without the last one (the client's own similarity 1 against its best peer), cut at the largest
difference; A_k = everything above the cut, including k. Here the peers (s_k without k itself)
are sorted and cut, which is the same whenever k is its own best match (always, up to rounding).
The paper's Alg. 1 returns {idx_m, …, idx_K}, which also keeps the client just below the cut;
the authors' code keeps only those above it, as here.

Interpretations where the paper is silent (several settled by the authors' published code):

- ``temperature`` M = 0.5 for every client (the authors' code divides one side only, a bug).
- ``head_weighting``: "uniform" (the authors' code) or "samples" (Eq. 7 as printed). Eq. 10 is
  weighted by the counts G only.
- Heads are kept by the server keyed by client id (the authors' code confuses ids with upload
  order). A client that never uploaded keeps the run's common initial head. Under partial
  participation S, MDS, Δs̄ and Eq. 10 involve only the uploading clients; the other clients'
  heads stay as they were. Eq. 8 prints a sum; the mean is used (the same ratio under full
  participation, comparable across rounds of different sizes otherwise).
- Eq. 9 keeps the CCP while the ratio is > δ; the notes (authors' code) end it when the ratio
  is < δ, used here (they differ only at exact equality).
- Ties: the peers are sorted stably and the cut is placed by value, so equal similarities are
  never split; of equal largest gaps the lowest is taken (numpy's argmax), giving the larger set.
  With no gap to compare (one peer, or all peers equally similar) every uploading client is
  relevant and Δs_k = 0 (one uploading client: A_k = {k}). While the historical maximum of
  Δs̄ is 0 the ratio counts as 1 (nothing has dropped yet), so the CCP continues.
- "Equal" is up to ``TIE`` = 1e-9: the float64 cosines of identical heads differ by ~1e-16
  depending on the BLAS, so a gap of at most ``TIE`` is no gap (Δs_k = 0 exactly, nobody cut
  off), gaps within ``TIE`` of the largest count as equal to it, and a ratio within ``TIE`` of δ
  as δ. Otherwise rounding alone would split a set, pick another cut, or move the CCP's end.
- After the CCP, G[k, j] > 0 only for clients j that uploaded during the CCP, so every φ̂_j in
  Eq. 10 exists. A client whose row of G is empty (it never took part during the CCP) gets its
  own upload, as if G[k, k] = 1 (MDS always counts k in its own set).
- r is drawn from a torch.Generator seeded from (run seed, round); heads are evaluated in eval
  mode without gradients.
- ``random_feature``: "paper" (default) draws one feature a round, "each element is
  independently sampled from a uniform distribution in the range [0,1)" (Sec. 4.1), for every
  row of S. The authors' code (``compute_similarity_guassian``) instead draws a new feature for
  each client's row, ``torch.rand_like(...) * 0.5``, so row k compares every head's response to
  client k's own r_k ~ U[0, 0.5)^d and S is not symmetric: option "code". Not validated against
  each other yet (the paper's text is the default).
- Global model (for the global test split): the FedAvg body with the n-weighted mean of the
  round's uploaded heads (trained from personalised heads, so FedAvg's model only when
  ``mds = false``); it is never sent to clients when ``mds`` is on.
- Ablations (Table 5): ``mds = false`` gives every client the FedAvg head, i.e. plain FedAvg
  (exactly: same client training, same aggregation, nothing logged); ``ccp = false`` runs MDS
  every round and never switches to Eq. 10.

Missing replies (``--dropout``, rejected replies): the clients that did not reply are treated as
not sampled: S, MDS, Δs̄, G and Eq. 10 use the uploading clients only, and the others keep their
heads and their rows of G. A round with fewer than three uploads (so no client has two peers to
compare) does not take part in the CCP check (it never ends the CCP; ``ratio`` null in its log)
once Δs̄ has been positive. The body and the global head average the uploads that arrived.

Reference settings (``fedtail list``; a run gets them unless it sets them), from the authors'
code: the head is every FC layer (``--head all-fc``; the model's own split for cnn2fc and
alexnet-small), local SGD with momentum 0.9 and gradient-norm clipping at 10 (the paper says
only "mini-batch SGD"). One difference remains: the authors' clients build their optimizer
once, so its momentum buffer carries over from round to round (into the newly received body
and head); fedtail's clients start every round with a fresh optimizer, like every other method.

``client_training`` (Table 4, "Compatibility with FedPAC"): ``"joint"`` (the default: FedAvg's local
epochs on the whole model; FedReMa "does not introduce any new methods on the client side");
``"align"`` is FedReMa+F, FedPAC's feature alignment, the loss CE + λ·L_d(h̄; h) of Eq. 11 with h̄ the
global prototype of the sample's class (the server's mean of the clients' per-class feature means,
sent with ``fit``; ``align_lam`` = λ, FedPAC's R and weighting: :mod:`.fedpac`); ``"alternate-align"``
is FedReMa+A&F, "optimizing the classifier first, then the feature extractor": ``align_head_epochs``
on the head with the body frozen, then the run's epochs on the body with the head frozen and the
alignment, as FedPAC's client. The "features" are the body's output (the input of FedReMa's head).
The paper gives neither λ nor the head epochs: λ 1 and 1 epoch, FedPAC's defaults, until validated.

``similarity_rounds`` (Fig. 3: S(t) at t = 1, 50, 100, 150 under FedAvg) logs S itself at those
rounds as ``fedrema_similarity`` (``round``, ``clients``: the uploading ids in S's order, ``S``
rounded to 4 places), with MDS on or off (``mds = false`` is Table 5's FedAvg row: FedAvg with
FedReMa's optimizer and head split), computed as in the MDS rounds and changing nothing else.
``fedtail report`` draws each run's logged matrices as heatmaps.

Each round logs ``fedrema``: ``ccp`` (this round aggregated by MDS), ``ccp_rounds`` (MDS rounds
so far: Table 3's "epochs of CCP"), and in MDS rounds ``mean_gap`` (Δs̄^t), ``max_gap``,
``ratio``, ``ended`` (the CCP ended this round), ``clients`` (the uploading ids, sorted),
``set_sizes`` and, for runs of at most 32 clients, ``sets`` (each A_k as client ids).

Devices: the server's soft logits, S and MDS are a few small products and run on the CPU, where
the uploaded heads arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedtail.algorithms.aggregate import WeightedMean, weighted_mean
from fedtail.algorithms.base import Algorithm, AlgorithmConfig, Comm, Message, Reference, ServerHalf, Tensors
from fedtail.algorithms.base import FeatureTerm
from fedtail.algorithms.clustering import cosine_matrix
from fedtail.algorithms.fedavg import FedAvgClient
from fedtail.algorithms.fedproto import COUNTS, MEANS, PRESENT, global_prototypes, prototype_payload
from fedtail.algorithms.fedrep import train_only
from fedtail.algorithms.prototypes import ClassMean, alignment_loss, class_statistics

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext, ServerContext

FEDREMA_CODE = "FedReMa's code (liangh68/FedReMa)"
SOFT_LOGITS_KEY = 0x50F7  # seed key of the random feature r, with the run seed and the round
SETS_LOGGED_UP_TO = 32  # log the relevant sets themselves for runs of at most this many clients
TIE = 1e-9  # similarities, gaps and ratios closer than this are equal (rounding differs between machines)


class FedReMaConfig(AlgorithmConfig):
    delta: float = Field(
        0.5, ge=0, le=1, description="δ: the CCP ends when mean Δs / its historical max < δ (Eq. 9)"
    )
    temperature: float = Field(0.5, gt=0, description="M in the soft logits softmax(head(r)/M)")
    head_weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="heads in A_k averaged uniformly (authors' code) or by n_k (Eq. 7)"
    )
    client_training: Literal["joint", "align", "alternate-align"] = Field(
        "joint", description="clients: joint (FedAvg's training), align (FedReMa+F: FedPAC's feature alignment), "
        "alternate-align (FedReMa+A&F: head first, then the body with the alignment)"
    )
    align_lam: float = Field(1.0, ge=0, description="λ of the feature alignment (client_training align / alternate-align)")
    align_head_epochs: int = Field(1, ge=1, description="head epochs before the body's (client_training alternate-align)")
    similarity_rounds: list[int] = Field(
        default_factory=list, description="rounds at which S(t) itself is logged (fedrema_similarity; Fig. 3), "
        "with MDS on or off; changes no result"
    )
    mds: bool = Field(True, description="false: heads averaged like the body (plain FedAvg)")
    ccp: bool = Field(True, description="false: MDS every round, never the G-based aggregation")
    random_feature: Literal["paper", "code"] = Field(
        "paper",
        description="paper: one r ~ U[0,1)^d a round for every row of S (Sec. 4.1); "
        "code: client k's row from its own r_k ~ U[0,0.5)^d (the authors' serverReMa.py)",
    )


def random_feature(seed: int, dim: int) -> torch.Tensor:
    """r ~ U[0, 1)^dim from a generator seeded with ``seed`` (on the CPU, where the server's math runs)."""
    return torch.rand(dim, generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")


def soft_logits(
    head: nn.Module, heads: Sequence[Tensors], r: torch.Tensor, temperature: float, prefix: str = "head."
) -> torch.Tensor:
    """Rows p_k = softmax(head_k(r) / M), head_k given as named tensors under ``prefix``."""
    was_training = head.training
    head.eval()
    try:
        with torch.no_grad():
            logits = [
                functional_call(head, {k.removeprefix(prefix): v for k, v in h.items()}, (r[None],))[0]
                for h in heads
            ]
    finally:
        head.train(was_training)
    return torch.softmax(torch.stack(logits) / temperature, dim=1)


def mds(row: torch.Tensor | Sequence[float], k: int) -> tuple[list[int], float]:
    """Maximum difference segmentation of similarity row ``row`` of client ``k`` (Alg. 1).

    Returns the positions (into ``row``) of the relevant set A_k, k included and sorted, and the
    largest gap Δs_k between consecutive sorted peer similarities.
    """
    row = torch.as_tensor(row, dtype=torch.float64, device="cpu")
    peers = [j for j in range(len(row)) if j != k]
    if len(peers) < 2:  # no gap to compare: one peer is as relevant as all peers
        return list(range(len(row))), 0.0
    values = row[peers]
    ordered = torch.sort(values, stable=True).values
    gaps = ordered[1:] - ordered[:-1]  # the gap to k's own similarity is never among these
    largest = float(gaps.max())
    if largest <= TIE:  # all peers equally similar (up to rounding): no gap, all relevant
        return list(range(len(row))), 0.0
    m = int(torch.nonzero(gaps >= largest - TIE)[0])  # the first of equal largest gaps
    cut = ordered[m + 1]  # by value, so equal similarities stay on one side
    members = [j for j, v in zip(peers, values.tolist()) if v >= cut] + [k]
    return sorted(members), float(gaps[m])


def ccp_check(mean_gap: float, max_gap: float, delta: float) -> tuple[bool, float, float]:
    """Eq. 8–9 for one round: (the CCP goes on, the new historical max, the ratio).

    The historical max includes this round; while it is 0 the ratio counts as 1. A ratio within
    ``TIE`` of δ counts as δ (the CCP goes on), whatever the rounding.
    """
    max_gap = max(max_gap, mean_gap)
    ratio = mean_gap / max_gap if max_gap > 0 else 1.0
    return ratio >= delta - TIE, max_gap, ratio


class FedReMaServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        model = ctx.model()
        self.body_keys = model.body_keys()
        self.head_keys = model.head_keys()
        self.body: Tensors = {k: ctx.init_weights[k] for k in self.body_keys}
        self.init_head: Tensors = {k: ctx.init_weights[k] for k in self.head_keys}
        self.global_head: Tensors = dict(self.init_head)  # FedAvg of the latest round's uploaded heads
        self.heads: dict[int, Tensors] = {}  # personalised head φ_k by client id (absent: see head_of)
        self.uploads: dict[int, Tensors] = {}  # each client's most recent uploaded head φ̂_j
        n = ctx.num_clients
        self.G = torch.zeros(n, n, dtype=torch.int64, device="cpu")
        self.in_ccp = True  # the critical co-learning period has not ended
        self.max_gap = 0.0  # historical max of the mean Δs
        self.ccp_rounds = 0
        if ctx.options.client_training != "joint":  # global prototypes of FedReMa+F and +A&F
            self.protos: torch.Tensor | None = None
            self.present: torch.Tensor | None = None

    def head_of(self, cid: int) -> Tensors:
        """Client ``cid``'s head: its personalised one, else the initial head (the FedAvg head without MDS)."""
        opts: FedReMaConfig = self.ctx.options
        return self.heads.get(cid, self.init_head if opts.mds else self.global_head)

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FedReMaConfig = self.ctx.options
        aligned = opts.client_training != "joint"
        prototypes = global_prototypes(self.protos, self.present) if aligned else {}
        messages = {cid: Message("fit", self.body | self.head_of(cid) | prototypes) for cid in clients}
        bodies, heads = WeightedMean(), WeightedMean()
        protos = ClassMean("uniform")  # FedPAC's reference aggregation of the class means
        uploaded: dict[int, Tensors] = {}
        sizes: dict[int, float] = {}
        for cid, reply in comm.stream(messages):
            n = reply.num_examples
            head = {k: reply.tensors[k] for k in self.head_keys}
            bodies.add({k: reply.tensors[k] for k in self.body_keys}, n)
            heads.add(head, n)
            uploaded[cid], sizes[cid] = head, n
            if aligned:
                protos.add(reply.tensors[MEANS], reply.tensors[COUNTS])
        self.body = bodies.result()
        self.global_head = heads.result()
        if aligned:
            self.protos, self.present = protos.result()
        ids = sorted(uploaded)  # everything below is by client id, whatever the upload order
        S = None
        if rnd in opts.similarity_rounds:
            S = self._similarity(rnd, ids, uploaded)
            comm.log(fedrema_similarity={"round": rnd, "clients": ids, "S": [[round(float(v), 4) for v in row] for row in S]})
        if not opts.mds:  # Table 5's "None (FedAvg)": every client gets the FedAvg head
            return
        self.uploads.update(uploaded)
        if self.in_ccp:
            comm.log(fedrema=self._relevant_matching(rnd, ids, uploaded, sizes, S))
        else:
            for k in ids:  # Eq. 10 over the most recent uploads
                row = self.G[k]
                peers = row.nonzero().flatten().tolist()
                if not peers:  # k never took part in the CCP: its own upload (as if G[k, k] = 1)
                    peers, row = [k], {k: 1}
                self.heads[k] = weighted_mean((self.uploads[j], float(row[j])) for j in peers)
            comm.log(fedrema={"ccp": False, "ccp_rounds": self.ccp_rounds})

    def _similarity(self, rnd: int, ids: list[int], uploaded: dict[int, Tensors]) -> torch.Tensor:
        """S(t) of the uploaded heads (rows and columns in ``ids`` order): the cosine similarity of
        their soft logits on the round's random feature (``random_feature``)."""
        opts: FedReMaConfig = self.ctx.options
        model = self.ctx.model("fedrema")
        heads = [uploaded[k] for k in ids]
        if opts.random_feature == "paper":
            r = random_feature(self.ctx.seed(rnd, SOFT_LOGITS_KEY), model.feature_dim)
            p = soft_logits(model.head, heads, r, opts.temperature)
            return cosine_matrix(p, p)
        rows = []  # row i of S under client i's own feature, U[0, 0.5) as the authors' code draws it
        for i, k in enumerate(ids):
            r = 0.5 * random_feature(self.ctx.seed(rnd, SOFT_LOGITS_KEY, k), model.feature_dim)
            p = soft_logits(model.head, heads, r, opts.temperature)
            rows.append(cosine_matrix(p[i : i + 1], p)[0])
        return torch.stack(rows)

    def _relevant_matching(
        self, rnd: int, ids: list[int], uploaded: dict[int, Tensors], sizes: dict[int, float],
        S: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """One CCP round: soft logits, MDS per client, Eq. 7, G, then the CCP check (``S``: the
        round's similarity matrix, if already computed)."""
        opts: FedReMaConfig = self.ctx.options
        if S is None:
            S = self._similarity(rnd, ids, uploaded)
        by_samples = opts.head_weighting == "samples"
        sets, gaps = [], []
        for i, k in enumerate(ids):
            members, gap = mds(S[i], i)
            A = [ids[j] for j in members]
            self.heads[k] = weighted_mean((uploaded[j], sizes[j] if by_samples else 1.0) for j in A)  # Eq. 7
            self.G[k, A] += 1
            sets.append(A)
            gaps.append(gap)
        self.ccp_rounds += 1
        mean_gap = sum(gaps) / len(gaps)
        ratio: float | None
        if len(ids) < 3 and self.max_gap > 0:
            # No uploader had two peers to compare (Δs_k = 0 by convention): a round whose other
            # clients did not reply says nothing about Δs̄, so it cannot end the CCP.
            goes_on, ratio = True, None
        else:
            goes_on, self.max_gap, ratio = ccp_check(mean_gap, self.max_gap, opts.delta)
        self.in_ccp = goes_on or not opts.ccp  # the ablation without CCP runs MDS every round
        record: dict[str, Any] = {
            "ccp": True,
            "ccp_rounds": self.ccp_rounds,
            "mean_gap": mean_gap,
            "max_gap": self.max_gap,
            "ratio": ratio,
            "ended": not self.in_ccp,
            "clients": ids,
            "set_sizes": [len(A) for A in sets],
        }
        if self.ctx.num_clients <= SETS_LOGGED_UP_TO:
            record["sets"] = sets
        return record

    def evaluation_message(self, cid: int) -> Message:
        return Message("evaluate", self.body | self.head_of(cid))

    def global_weights(self) -> Tensors:
        return self.body | self.global_head


class FedReMaClient(FedAvgClient):
    """FedAvg's client, or with FedPAC's feature alignment (and alternate training): Table 4's variants."""

    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        opts: FedReMaConfig = ctx.options
        if opts.client_training == "joint":
            return super().fit(msg, ctx)
        model = ctx.load({k: v for k, v in msg.tensors.items() if k not in (MEANS, PRESENT)})
        target = prototype_payload(msg)
        feature_loss = None if target is None or opts.align_lam == 0 else alignment_loss(*target, opts.align_lam, "mse")
        if opts.client_training == "alternate-align":
            train_only(ctx, model.head, model.body, opts.align_head_epochs)
            train_only(ctx, model.body, model.head, None, hook=FeatureTerm(feature_loss))
        else:
            ctx.train(hook=FeatureTerm(feature_loss))
        local = class_statistics(model, ctx.dataset, ctx.data.train, ctx.num_classes)
        return ctx.reply(ctx.weights() | {MEANS: local.means, COUNTS: local.counts})


FEDREMA = Algorithm(
    name="fedrema",
    summary="FedReMa (Liang et al. 2024): FedAvg body, heads averaged over MDS-relevant peers, then by history G",
    server=FedReMaServer,
    client=FedReMaClient,
    config=FedReMaConfig,
    reference=Reference(FEDREMA_CODE, head="all-fc", momentum=0.9, grad_clip=10.0),
    why_not={"segmentation": "its feature prototypes and classifier similarity read flat per-sample features"},
    robust="averages each client's head over its own set of relevant peers",
)
