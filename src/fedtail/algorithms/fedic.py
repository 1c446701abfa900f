"""FEDIC: federated ensemble distillation with imbalance calibration.

Shang, Lu, Cheung and Wang, "FEDIC: Federated Learning on Non-IID and Long-Tailed Data via
Calibrated Distillation", ICME 2022 (arXiv:2205.00172). The server holds a small class-balanced
labelled set L and unlabelled data U (``--set partition.server_samples_per_class=…`` and
``partition.server_unlabelled=…``: carved from the training split before the long-tail cut, as the
authors carve 100 images per class of CIFAR-10 before cutting the rest). Round t, clients S_t (K):

1. client k trains w^{t−1} locally as in FedAvg and uploads w_k;
2. FedAvg: w̄ = Σ_k (n_k / n) w_k;
3. calibration model: w_c = w̄ fine-tuned for ``finetune_steps`` Adam steps of CE on batches of
   ``labelled_batch`` samples of L; its logits z_c(x);
4. calibrated ensemble (the "calibration gating network"), with z_k(x), h_k(x) the logits and body
   features of client model k (eval mode):

       ω_k(x) = σ(a_k) / Σ_j σ(a_j),  a_k = z_k(x)·s + b_s        per-sample client weights
       z_e(x) = Σ_k ω_k(x) z_k(x),   h(x) = (1/K) Σ_k h_k(x)
       g(x)   = σ(v·h(x) + b_g)                                    the gate
       ẑ(x)   = g(x) · (α ⊙ z_e(x) + β) + (1 − g(x)) · z_c(x)      logit adjustment α, β per class

   (s, b_s, α, β, v, b_g) are fitted by ``gate_steps`` Adam steps of CE(ẑ, y) on batches of L;
5. distillation: w^t = w̄ after ``distill_steps`` Adam steps on

       λ · KL(softmax(ẑ(u)/T) ‖ softmax(f(u; w)/T)) + (1 − λ) · CE(f(x; w), y),

   u a batch of ``unlabelled_batch`` samples of U, (x, y) a batch of ``labelled_batch`` of L.

w^t is the global model; the personalised accuracy is w^t on each client's local test data
(FEDIC has no personal model). With ``distill_steps = 0`` a round is exactly FedAvg's.

The equations of steps 3-5 are read from the authors' code (the paper text is not at hand); the
defaults are that code's: 100 steps each, Adam lr 0.001, weight decay 2·10⁻⁴ for the fine-tuning
and the distillation (none for the gate), batches of 20 labelled and 128 unlabelled samples,
T = 2, λ = 0.5, no T² factor on the KL term, s = 1, α = 1, b_s = β = 0 and PyTorch's Linear init
for (v, b_g) at the start.

*Interpretations and deviations* (options where reasonable):

- ``gate_persist`` (default true): the gate's parameters carry over from round to round (the
  authors create the gating network once); the Adam states of the three server trainings start
  afresh every round (the authors' optimizers persist). ``false``: a fresh gate every round.
- U is drawn from the training split (its class mix is the split's); the authors use another
  dataset (CIFAR-100 images for CIFAR-10). ``distill_data = "all"`` distils on L ∪ U instead of U.
- batches are independent draws without replacement from a stream seeded by (run seed, round);
  the ensemble's outputs are computed once per round, in inference mode, on exactly the samples
  the drawn batches use (the authors recompute them per batch: the same values).
- ``ensemble_weighting = "uniform"`` replaces the learned ω_k by 1/K.
- ``teacher = "ensemble"`` skips steps 3-4: ẑ = (1/K) Σ_k z_k (FedDF-style plain ensemble).
- ``prior_tau`` τ > 0 (default 0, not in the authors' code): client k also uploads its class counts
  n_k^c and its logits are first adjusted post hoc by its label prior (Menon et al.'s logit
  adjustment), z_k ← z_k − τ log π_k with π_k^c = (n_k^c + 1) / (n_k + C) (Laplace smoothing, so
  classes a client lacks stay finite).
- ω_k is computed in log space, ω_k = exp(log σ(a_k) − logsumexp_j log σ(a_j)): the same
  value where σ(a_j) does not underflow (float rounding apart), and finite where it does. The
  direct quotient does not survive long runs: on fmnist stages (20 clients, IF 10) Σ_j σ(a_j)
  fell from 2.3 to 5·10⁻¹⁶ to 0.0, the gate was NaN from round 4 and the global accuracy 0.10.
- Server training (fine-tuning, gate, distillation) runs with autograd; every other server
  computation (the client models' outputs, the teacher) in inference mode.

Missing replies (``--dropout``, rejected replies): w̄ averages the models that arrived, and the
ensemble (ω_k, h(x), or the plain mean of logits) runs over those clients only (K is the number
of replies); the gate's parameters are per class and feature, not per client, so they carry over.

Devices: the server's passes over its data (the clients' logits, the calibration model, the gate,
the distillation) run on the compute device; the global weights and the gate stay on the CPU
between rounds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    Comm,
    Message,
    Reference,
    ServerHalf,
    Tensors,
    class_counts,
)
from fedtail.algorithms.fedavg import FedAvgClient
from fedtail.errors import ConfigError

if TYPE_CHECKING:
    from fedtail.data.base import Dataset, Split
    from fedtail.engine.context import ClientContext, ServerContext
    from fedtail.models import SplitModel

COUNTS = "fedic.counts"  # client -> server: training samples per class (only with prior_tau > 0)
GATE_KEY = 0xFED1C  # seed key of the gate's initial draw
BATCH_KEY = 0xBA7C  # seed key of a round's batch draws
INFERENCE_BATCH = 128


class FEDICConfig(AlgorithmConfig):
    """FEDIC options (defaults: the authors' code, except λ: the value validated for GLDP's tables)."""

    distill_steps: int = Field(
        100, ge=0, description="Adam steps distilling the teacher into the global model (0 = FedAvg)"
    )
    distill_lr: float = Field(0.001, gt=0, description="Adam learning rate of the distillation")
    distill_weight: float = Field(
        0.25,
        ge=0,
        le=1,
        description="λ: KL weight; 1 − λ weighs the CE on the labelled set "
        "(0.25 validated in benchmarks/gldp; the authors' code: 0.5)",
    )
    temperature: float = Field(2.0, gt=0, description="T of the distillation's softmaxes")
    distill_data: Literal["unlabelled", "all"] = Field(
        "unlabelled", description="samples of the KL term: the unlabelled set, or labelled ∪ unlabelled"
    )
    unlabelled_batch: int = Field(128, ge=1, description="samples of the KL term per distillation step")
    labelled_batch: int = Field(20, ge=1, description="labelled samples per step (fine-tuning, gate, CE term)")
    weight_decay: float = Field(
        2e-4, ge=0, description="Adam weight decay of the fine-tuning and the distillation"
    )
    teacher: Literal["calibrated", "ensemble"] = Field(
        "calibrated", description="calibrated: the gated, calibrated ensemble; ensemble: the mean of client logits"
    )
    finetune_steps: int = Field(100, ge=0, description="Adam steps fine-tuning the FedAvg model on the labelled set")
    finetune_lr: float = Field(0.001, gt=0, description="Adam learning rate of the fine-tuning")
    gate_steps: int = Field(100, ge=0, description="Adam steps fitting the calibration gating network")
    gate_lr: float = Field(0.001, gt=0, description="Adam learning rate of the gating network")
    gate_persist: bool = Field(True, description="keep the gating network's parameters across rounds")
    ensemble_weighting: Literal["gated", "uniform"] = Field(
        "gated", description="client weights of the ensemble: learned per sample, or 1/K"
    )
    prior_tau: float = Field(0.0, ge=0, description="τ of a post-hoc logit adjustment by each client's label prior")


# -- the calibrated ensemble --------------------------------------------------------------------


def init_gate(num_classes: int, feature_dim: int, generator: torch.Generator) -> Tensors:
    """The gating network's parameters: identity calibration, PyTorch's Linear init for the gate;
    on ``generator``'s device (the CPU, where the server keeps them between rounds)."""
    bound = 1.0 / math.sqrt(feature_dim)
    device = generator.device
    return {
        "ensemble_scale": torch.ones(num_classes, device=device),
        "ensemble_bias": torch.zeros(1, device=device),
        "logit_scale": torch.ones(num_classes, device=device),
        "logit_bias": torch.zeros(num_classes, device=device),
        "gate_weight": (torch.rand(feature_dim, generator=generator, device=device) * 2 - 1) * bound,
        "gate_bias": (torch.rand(1, generator=generator, device=device) * 2 - 1) * bound,
    }


def prior_adjust(logits: torch.Tensor, counts: torch.Tensor, tau: float) -> torch.Tensor:
    """z − τ log π with π^c = (n^c + 1) / (n + C) (Menon et al.'s post-hoc logit adjustment)."""
    counts = counts.to(logits.device, torch.float32)
    prior = (counts + 1) / (counts.sum() + len(counts))
    return logits - tau * prior.log()


def ensemble_weights(client_logits: torch.Tensor, gate: Tensors, weighting: str) -> torch.Tensor:
    """(K, n) per-sample client weights summing to 1 over the K clients."""
    K, n, _ = client_logits.shape
    if weighting == "uniform":
        return torch.full((K, n), 1.0 / K, device=client_logits.device)
    # σ(a_k)/Σ_j σ(a_j) in log space: in float32 σ(a) is 0 for a ≲ −89 (0/0 = NaN, and a
    # NaN gradient poisons the persistent gate), log σ(a) ≈ a stays finite.
    log_sig = F.logsigmoid(client_logits @ gate["ensemble_scale"] + gate["ensemble_bias"])
    return (log_sig - torch.logsumexp(log_sig, dim=0, keepdim=True)).exp()


def calibrated_logits(
    gate: Tensors, client_logits: torch.Tensor, features: torch.Tensor, anchor: torch.Tensor, weighting: str
) -> torch.Tensor:
    """ẑ = g·(α ⊙ Σ_k ω_k z_k + β) + (1 − g)·z_c for client logits (K, n, C), mean features (n, D)
    and the calibration model's logits z_c (n, C)."""
    w = ensemble_weights(client_logits, gate, weighting)
    z = (w.unsqueeze(-1) * client_logits).sum(0)
    g = torch.sigmoid(features @ gate["gate_weight"] + gate["gate_bias"]).unsqueeze(1)
    return g * (gate["logit_scale"] * z + gate["logit_bias"]) + (1 - g) * anchor


def fit_gate(
    gate: Tensors,
    client_logits: torch.Tensor,
    features: torch.Tensor,
    anchor: torch.Tensor,
    labels: torch.Tensor,
    batches: list[torch.Tensor],
    lr: float,
    weighting: str,
) -> tuple[Tensors, list[float]]:
    """Adam steps of CE(ẑ, y) over row batches of the labelled set; the fitted gate (on the logits'
    device) and the losses."""
    params = {k: v.detach().to(client_logits.device, copy=True).requires_grad_(True) for k, v in gate.items()}
    optimizer = torch.optim.Adam(params.values(), lr=lr)
    losses = []
    for rows in batches:
        logits = calibrated_logits(params, client_logits[:, rows], features[rows], anchor[rows], weighting)
        loss = F.cross_entropy(logits, labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return {k: v.detach().clone() for k, v in params.items()}, _floats(losses)


# -- server-side passes over the server's data -------------------------------------------------


def outputs(
    model: SplitModel, dataset: Dataset, split: Split, index: torch.Tensor, features: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (n, C) and body features (n, D) of ``model`` on ``split[index]``, eval mode, inference mode.

    Returned as ordinary tensors (cloned outside inference mode) so server training can use them.
    """
    model.eval()
    logits, feats = [], []
    with torch.inference_mode():
        for batch in index.split(INFERENCE_BATCH):
            x, _ = dataset.batch(split, batch)
            h = model.features(x)
            logits.append(model.head(h))
            if features:
                feats.append(h)
    z = torch.cat(logits) if logits else torch.empty(0, model.num_classes, device=index.device)
    h = (torch.cat(feats) if feats else torch.empty(0, model.feature_dim, device=index.device)) if features else None
    return z.clone(), None if h is None else h.clone()


def draw_batches(
    n: int, size: int, steps: int, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor]:
    """``steps`` independent batches of min(size, n) distinct positions in 0..n−1, drawn on
    ``generator``'s device (the CPU) and put on ``device``."""
    if steps == 0:
        return []
    drawn = torch.stack([torch.randperm(n, generator=generator, device=generator.device)[:size] for _ in range(steps)])
    return list(drawn.to(device).unbind())  # one copy for all of them


def _floats(values: list[torch.Tensor]) -> list[float]:
    """Per-step losses as numbers, read once after the steps (no wait for the device per step)."""
    return torch.stack(values).tolist() if values else []


def finetune(
    model: SplitModel,
    dataset: Dataset,
    split: Split,
    index: torch.Tensor,
    batches: list[torch.Tensor],
    lr: float,
    weight_decay: float,
) -> list[float]:
    """Adam steps of CE on ``split[index[b]]`` for each position batch b; the losses."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for rows in batches:
        x, y = dataset.batch(split, index[rows])
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return _floats(losses)


def kd_loss(student_logits: torch.Tensor, teacher_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher ‖ softmax(student/T)), batch mean (the authors' form: no T² factor)."""
    return F.kl_div(F.log_softmax(student_logits / temperature, dim=1), teacher_probs, reduction="batchmean")


def distil(
    model: SplitModel,
    dataset: Dataset,
    split: Split,
    soft_index: torch.Tensor,
    teacher_probs: torch.Tensor,
    soft_batches: list[torch.Tensor],
    hard_index: torch.Tensor,
    hard_batches: list[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    weight: float,
    temperature: float,
) -> list[float]:
    """Adam steps on λ·KL(teacher ‖ student) over ``split[soft_index[b]]`` (teacher row b of
    ``teacher_probs``) + (1 − λ)·CE over ``split[hard_index[b']]``; the KL of every step."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    kls = []
    for step, rows in enumerate(soft_batches):
        x, _ = dataset.batch(split, soft_index[rows])
        kl = kd_loss(model(x), teacher_probs[rows], temperature)
        loss = weight * kl
        if weight < 1:
            xl, yl = dataset.batch(split, hard_index[hard_batches[step]])
            loss = loss + (1 - weight) * F.cross_entropy(model(xl), yl)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        kls.append(kl.detach())
    return _floats(kls)


def _get(model: SplitModel) -> Tensors:
    """The model's weights, copied to the CPU (where the server keeps its state)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _ends(values: list[float]) -> tuple[float | None, float | None]:
    return (values[0], values[-1]) if values else (None, None)


# -- the halves ---------------------------------------------------------------------------------


class FEDICServer(ServerHalf):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts: FEDICConfig = ctx.options
        self.weights: Tensors = dict(ctx.init_weights)
        data = ctx.server_data
        if opts.distill_steps > 0:
            soft = len(data.unlabelled) + (len(data.labelled) if opts.distill_data == "all" else 0)
            if soft == 0:
                raise ConfigError(
                    "fedic distils on the server's unlabelled data: set partition.server_unlabelled > 0 "
                    "(or fedic.distill_data=all with partition.server_samples_per_class > 0)")
            needs_labels = opts.teacher == "calibrated" or opts.distill_weight < 1
            if needs_labels and len(data.labelled) == 0:
                raise ConfigError(
                    "fedic needs the server's labelled set (calibration, CE term): set "
                    "partition.server_samples_per_class > 0, or fedic.teacher=ensemble with fedic.distill_weight=1")
        self.gate: Tensors | None = None
        if opts.gate_persist:
            dim = ctx.model("fedic-student").feature_dim
            self.gate = init_gate(ctx.num_classes, dim, torch.Generator(device="cpu").manual_seed(ctx.seed(GATE_KEY)))

    def run_round(self, rnd: int, clients: list[int], comm: Comm) -> None:
        opts: FEDICConfig = self.ctx.options
        out = {cid: Message("fit", self.weights) for cid in clients}
        mean = WeightedMean()
        if opts.distill_steps == 0:  # nothing to distil: FedAvg's round, nothing else computed
            for _, reply in comm.stream(out):
                mean.add(reply.tensors, reply.num_examples)
            self.weights = mean.result()
            return

        ctx, data = self.ctx, self.ctx.server_data
        dataset, split = ctx.dataset, data.split
        calibrated = opts.teacher == "calibrated"
        generator = torch.Generator(device="cpu").manual_seed(ctx.seed(rnd, BATCH_KEY))
        soft_index = (
            data.unlabelled if opts.distill_data == "unlabelled" else torch.cat((data.labelled, data.unlabelled))
        )
        n_lab = len(data.labelled)
        # Every batch of the round is drawn first, so the ensemble is run only on the samples used.
        device = ctx.device  # the server's passes over its data run there; the weights stay on the CPU
        soft_batches = draw_batches(len(soft_index), opts.unlabelled_batch, opts.distill_steps, generator, device)
        hard_batches = (
            draw_batches(n_lab, opts.labelled_batch, opts.distill_steps, generator, device)
            if opts.distill_weight < 1 else []
        )
        finetune_batches = (
            draw_batches(n_lab, opts.labelled_batch, opts.finetune_steps, generator, device) if calibrated else []
        )
        gate_batches = (
            draw_batches(n_lab, opts.labelled_batch, opts.gate_steps, generator, device) if calibrated else []
        )
        used = torch.unique(torch.cat(soft_batches))  # sorted positions into soft_index
        soft_batches = [torch.searchsorted(used, rows) for rows in soft_batches]  # now rows of `used`
        # Teacher rows: the labelled set (to fit the gate) first, then the soft samples used.
        rows = torch.cat((data.labelled, soft_index[used])) if calibrated else soft_index[used]
        first = n_lab if calibrated else 0

        client_model = ctx.model("fedic-client")
        logits: list[torch.Tensor] = []
        feature_sum: torch.Tensor | None = None
        for _, reply in comm.stream(out):
            weights = {k: v for k, v in reply.tensors.items() if k != COUNTS}
            mean.add(weights, reply.num_examples)
            client_model.load_state_dict(weights)
            z, h = outputs(client_model, dataset, split, rows, features=calibrated)
            if opts.prior_tau > 0:
                z = prior_adjust(z, reply.tensors[COUNTS], opts.prior_tau)
            logits.append(z)
            if h is not None:
                feature_sum = h if feature_sum is None else feature_sum.add_(h)
        self.weights = mean.result()
        client_logits = torch.stack(logits)  # (K, rows, C)

        log: dict[str, float | None] = {}
        if calibrated:
            features = feature_sum / len(logits)
            anchor_model = ctx.model("fedic-calibration")
            anchor_model.load_state_dict(self.weights)
            losses = finetune(anchor_model, dataset, split, data.labelled, finetune_batches,
                              opts.finetune_lr, opts.weight_decay)
            anchor, _ = outputs(anchor_model, dataset, split, rows, features=False)
            gate = self.gate if opts.gate_persist else init_gate(
                ctx.num_classes, features.shape[1], torch.Generator(device="cpu").manual_seed(ctx.seed(rnd, GATE_KEY)))
            labels = split.y[data.labelled]
            gate, gate_losses = fit_gate(gate, client_logits[:, :n_lab], features[:n_lab], anchor[:n_lab], labels,
                                         gate_batches, opts.gate_lr, opts.ensemble_weighting)
            if opts.gate_persist:
                self.gate = {k: v.to("cpu") for k, v in gate.items()}
            with torch.inference_mode():
                teacher = calibrated_logits(gate, client_logits[:, first:], features[first:], anchor[first:],
                                            opts.ensemble_weighting)
            log |= dict(zip(("fedic_finetune_loss_first", "fedic_finetune_loss_last"), _ends(losses)))
            log |= dict(zip(("fedic_gate_loss_first", "fedic_gate_loss_last"), _ends(gate_losses)))
        else:
            teacher = client_logits.mean(0)
        with torch.inference_mode():
            probs = F.softmax(teacher / opts.temperature, dim=1)
        student = ctx.model("fedic-student")
        student.load_state_dict(self.weights)
        kls = distil(
            student, dataset, split, soft_index[used], probs.clone(), soft_batches, data.labelled, hard_batches,
            lr=opts.distill_lr, weight_decay=opts.weight_decay, weight=opts.distill_weight,
            temperature=opts.temperature,
        )
        self.weights = _get(student)
        comm.log(**log, **dict(zip(("fedic_kl_first", "fedic_kl_last"), _ends(kls))))

    def global_weights(self) -> Tensors:
        return self.weights


class FEDICClient(FedAvgClient):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        reply = super().fit(msg, ctx)
        opts: FEDICConfig = ctx.options
        if opts.prior_tau > 0 and opts.distill_steps > 0:  # the server's logit adjustment needs the prior
            reply.tensors[COUNTS] = class_counts(ctx.dataset.train.y[ctx.data.train], ctx.num_classes)
        return reply


FEDIC = Algorithm(
    name="fedic",
    summary="FEDIC (Shang et al. 2022): FedAvg + calibrated ensemble distilled into the global model on server data",
    server=FEDICServer,
    client=FEDICClient,
    config=FEDICConfig,
    personal_model=False,
    reference=Reference("the authors' code (FEDIC, on CReFF-FL's code base)"),
    why_not={"segmentation": "its server-side ensemble distillation and logit calibration are of per-sample logits"},
    robust="its server distils the global model from an ensemble of every client's model, which no aggregation rule covers",
)
