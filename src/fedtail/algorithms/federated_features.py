"""Federated features: synthetic classifier inputs matched to the clients' real gradients.

The mechanism of CReFF (Shang et al., "Federated Learning on Heterogeneous and Long-Tailed Data
via Classifier Re-Training with Federated Features", IJCAI 2022), reused by MuPFL's PKCF
(the MuPFL paper, Eq. 16-21, whose numbering is cited below; the CReFF paper has the same steps).
Helper module, not an algorithm:

1. each client k computes, for every class c it holds, the gradient of the cross-entropy w.r.t.
   the classifier on real samples of class c, g_k^c = ∇_θ L(θ; f(x_c), c)   (Eq. 16)
   -> :func:`class_gradients`;
2. the server averages them over the clients holding c, g^c = (1/|K_c|) Σ_{k∈K_c} g_k^c
   (Eq. 17) -> :func:`mean_class_gradients` / :class:`ClassGradientMean`;
3. the server optimises m synthetic features per class so that the gradient they induce on the
   same classifier (Eq. 19) matches g^c in cosine distance (Eq. 20) -> :class:`FederatedFeatures`;
4. a classifier is trained on the features alone (Eq. 21; CReFF's re-training)
   -> :func:`train_classifier`.

Features live in the input space of ``model.classifier`` (the model's last ``nn.Linear``): for
models whose head is one Linear (cnn-fmnist, resnet8, mlp) that is the body output; for a
deeper head (cnn2fc) it is the hidden activation just before the last Linear. For a segmentation
model (a per-pixel classifier) the samples are pixels: each pixel of the body's feature map is one
feature vector, labelled with the client's mask at that position (nearest-neighbour downsampling
of the mask to the map's size; ignored pixels left out), and the per-class draws take pixels of
the class as the classification draws take samples (:func:`pixel_samples`).

Gradients of a linear layer under cross-entropy have a closed form, used throughout instead of
autograd through the layer: for logits z = hWᵀ + b on a batch of B rows with labels y,

    r_i = (softmax(z_i) − onehot(y_i)) / B,   ∂L/∂W = Σ_i r_i h_iᵀ,   ∂L/∂b = Σ_i r_i.

It is exactly the gradient autograd would return (tests check this), is differentiable w.r.t.
h (which is what matching needs; the authors get the same with ``create_graph=True``), and
costs about half as much as double backward (measured on C=10, D=3136, m=100).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedtail.algorithms.aggregate import active_rule, per_class
from fedtail.algorithms.base import shuffled, to_like
from fedtail.data.base import Dataset
from fedtail.models.base import SplitModel

Tensors = dict[str, torch.Tensor]

# Added to the product of norms in the cosine, as in the authors' matching loss, so a zero
# gradient row (a class whose probability is already 0 or 1) gives distance 1, not NaN.
COS_EPS = 1e-6


# --- client side: real per-class gradients ----------------------------------------------------


def classifier_inputs(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
    """The inputs of ``model.classifier`` for the batch ``x`` (no grad handling: the caller's)."""
    classifier = model.classifier
    if model.head is classifier:
        return model.features(x)
    if getattr(model, "dense", False):  # the per-pixel Linear reads the body's map, channels last
        return model.features(x).movedim(1, -1)  # (no full forward: its upsampled logits are large)
    # A deeper head: capture what reaches the last Linear rather than re-implementing the head.
    captured: list[torch.Tensor] = []
    handle = classifier.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return captured[0]


def pixel_samples(
    model: SplitModel, dataset: Dataset, index: torch.Tensor, labels: torch.Tensor | None, feature_batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A segmentation client's pixels as samples: (P, D) classifier inputs and their (P,) labels,
    from the images ``index`` of the train split with the client's label table ``labels`` (see the
    module docstring). The model is used as it is (the caller sets eval mode)."""
    split = dataset.train
    feats, ys = [], []
    for rows in index.split(feature_batch):
        x, y = dataset.batch(split, rows, labels)
        h = classifier_inputs(model, x)  # (B, h, w, D): what the per-pixel Linear reads
        y = F.interpolate(y[:, None].double(), size=h.shape[1:3], mode="nearest")[:, 0].long()
        valid = y >= 0
        feats.append(h[valid])
        ys.append(y[valid])
    return torch.cat(feats), torch.cat(ys)


def class_draws(
    labels: torch.Tensor, num_classes: int, generator: torch.Generator, *, repeats: int, batch_size: int
) -> dict[int, torch.Tensor]:
    """Per class present in ``labels``: a ``[repeats, k]`` tensor of positions into ``labels``.

    Each row is one draw of k = min(batch_size, n_c) distinct samples of class c (the authors
    draw a random batch of 32 per repeat). A class with n_c <= batch_size is drawn whole every
    time, so no random numbers are spent on it.
    """
    draws: dict[int, torch.Tensor] = {}
    for c in range(num_classes):
        pos = (labels == c).nonzero().flatten()
        n = len(pos)
        if n == 0:
            continue
        if n <= batch_size:
            draws[c] = pos.expand(repeats, n)
        else:
            draws[c] = torch.stack([shuffled(pos, generator)[:batch_size] for _ in range(repeats)])
    return draws


def linear_ce_gradients(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    h: torch.Tensor,
    y: torch.Tensor,
    row_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """∂/∂(W, b) of Σ_i w_i · CE(h_i Wᵀ + b, y_i), w_i = 1/B (B rows) if ``row_weight`` is None.

    Closed form (module docstring); differentiable w.r.t. ``h``, W and b. Leading batch
    dimensions of ``h`` / ``y`` give one gradient each (all classes' features at once).
    """
    logits = F.linear(h, weight, bias)
    residual = torch.softmax(logits, dim=-1) - F.one_hot(y, logits.shape[-1]).to(logits.dtype)
    if row_weight is None:
        row_weight = torch.full(y.shape, 1.0 / y.shape[-1], dtype=logits.dtype, device=logits.device)
    residual = residual * row_weight.unsqueeze(-1)
    return residual.transpose(-1, -2) @ h, residual.sum(-2)


@torch.no_grad()
def class_gradients(
    model: SplitModel,
    dataset: Dataset,
    index: torch.Tensor,
    num_classes: int,
    generator: torch.Generator,
    *,
    repeats: int = 10,
    batch_size: int = 32,
    feature_batch: int = 256,
    labels: torch.Tensor | None = None,
) -> tuple[Tensors, torch.Tensor]:
    """Per-class gradient of the CE w.r.t. ``model.classifier`` on real features (MuPFL Eq. 16).

    For each class c among the samples ``index`` (into ``dataset.train``): the mean over
    ``repeats`` draws of ``batch_size`` samples of c (all of them if c has fewer) of the batch
    gradient, with the body frozen and the model in eval mode (as in the authors' code).

    The mean over draws is linear in per-sample terms, so it is computed as one weighted sum:
    sample i of class c gets weight (times drawn) / (repeats · k_c). Features are computed once
    per distinct drawn sample, in batches of ``feature_batch``.

    Returns ``({"weight": [C, *W.shape], "bias": [C, *b.shape]}, present: bool[C])``; rows of
    absent classes are zero. Segmentation: the samples are the pixels of :func:`pixel_samples`
    (``labels``: the client's label table).
    """
    classifier = model.classifier
    if classifier.bias is None:
        raise ValueError("federated features need a classifier with a bias")
    weight = classifier.weight
    device = weight.device
    grad_w = torch.zeros(num_classes, *weight.shape, dtype=weight.dtype, device=device)
    grad_b = torch.zeros(num_classes, *classifier.bias.shape, dtype=weight.dtype, device=device)
    present = torch.zeros(num_classes, dtype=torch.bool, device=device)
    split = dataset.train
    pixels = None
    if dataset.segmentation:
        was_training = model.training
        model.eval()
        try:
            pixels = pixel_samples(model, dataset, index, labels, feature_batch)
        finally:
            model.train(was_training)
        sample_labels = pixels[1]
    else:
        sample_labels = split.y[index]
    draws = class_draws(sample_labels, num_classes, generator, repeats=repeats, batch_size=batch_size)
    if not draws:
        return {"weight": grad_w, "bias": grad_b}, present

    # How often each position of `index` was drawn, scaled to the per-class mean over draws.
    n = len(sample_labels)
    row_weight = torch.zeros(n, dtype=weight.dtype, device=device)
    for c, d in draws.items():
        counts = torch.bincount(d.flatten(), minlength=n).to(weight.dtype)
        row_weight += counts / d.numel()  # d.numel() = repeats · k_c; each position has one class
    used = row_weight.nonzero().flatten()

    if pixels is not None:
        feats = pixels[0][used]
    else:
        was_training = model.training
        model.eval()
        try:
            feats = torch.cat(
                [classifier_inputs(model, dataset.batch(split, index[b])[0]) for b in used.split(feature_batch)]
            )
        finally:
            model.train(was_training)

    used_labels, used_weight = sample_labels[used], row_weight[used]
    for c in draws:
        rows = used_labels == c
        gw, gb = linear_ce_gradients(weight, classifier.bias, feats[rows], used_labels[rows], used_weight[rows])
        grad_w[c], grad_b[c] = gw, gb
        present[c] = True
    return {"weight": grad_w, "bias": grad_b}, present


def pack_class_gradients(grads: Tensors, present: torch.Tensor, prefix: str = "grad.") -> Tensors:
    """Only the present classes' rows, for the wire: ``{prefix+weight, prefix+bias, prefix+classes}``."""
    classes = present.nonzero().flatten()
    return {
        f"{prefix}weight": grads["weight"][classes],
        f"{prefix}bias": grads["bias"][classes],
        f"{prefix}classes": classes,
    }


def unpack_class_gradients(
    tensors: Mapping[str, torch.Tensor], num_classes: int, prefix: str = "grad."
) -> tuple[Tensors, torch.Tensor]:
    """Inverse of :func:`pack_class_gradients` (absent rows zero)."""
    classes = tensors[f"{prefix}classes"]
    out = {}
    for name in ("weight", "bias"):
        rows = tensors[f"{prefix}{name}"]
        full = torch.zeros(num_classes, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        full[classes] = rows
        out[name] = full
    present = torch.zeros(num_classes, dtype=torch.bool, device=classes.device)
    present[classes] = True
    return out, present


# --- server side: aggregate, match, re-train ---------------------------------------------------


class ClassGradientMean:
    """Streaming per-class uniform mean over the clients holding each class (MuPFL Eq. 17).

    Uniform, not sample-weighted: every holder counts once, as in the authors' code. Sums in
    float64 so the result does not depend on the order clients arrive in (beyond rounding).
    Under the run's robust rule (made during a round, ``--aggregate``): the rule per class over its
    holders (:func:`~fedtail.algorithms.aggregate.per_class`); ``plain``: always the mean.
    """

    def __init__(self, plain: bool = False) -> None:
        self.rule = active_rule(plain)
        self.inputs: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []  # a robust rule's buffer
        self.sums: Tensors = {}
        self.counts: torch.Tensor | None = None
        self.dtypes: dict[str, torch.dtype] = {}

    def add(self, grads: Mapping[str, torch.Tensor], present: torch.Tensor) -> None:
        mask = present.to(torch.bool)
        if self.rule.kind != "mean":
            self.dtypes = self.dtypes or {name: g.dtype for name, g in grads.items()}
            self.inputs.append(({k: g.detach() for k, g in grads.items()}, mask))
            return
        if self.counts is None:
            self.counts = torch.zeros(len(mask), dtype=torch.int64, device=mask.device)
            for name, g in grads.items():
                self.sums[name] = torch.zeros(g.shape, dtype=torch.float64, device=g.device)
                self.dtypes[name] = g.dtype
        if grads.keys() != self.sums.keys() or len(mask) != len(self.counts):
            raise KeyError("class gradients of different layouts in one mean")
        self.counts += mask
        for name, g in grads.items():
            self.sums[name][mask] += g[mask].to(torch.float64)

    def result(self) -> tuple[Tensors, torch.Tensor]:
        if self.inputs:
            means, held = per_class(self.rule, self.inputs)
            return {k: v.to(self.dtypes[k]) for k, v in means.items()}, held.to(self.inputs[0][1].device)
        if self.counts is None:
            raise ValueError("mean of no class gradients")
        held = self.counts > 0
        out = {}
        for name, s in self.sums.items():
            scale = torch.where(held, 1.0 / self.counts.clamp(min=1).to(torch.float64), 0.0)
            out[name] = (s * scale.view(-1, *([1] * (s.dim() - 1)))).to(self.dtypes[name])
        return out, held


def mean_class_gradients(
    items: Iterable[tuple[Mapping[str, torch.Tensor], torch.Tensor]],
) -> tuple[Tensors, torch.Tensor]:
    """Per class, the uniform mean over the clients that hold it (MuPFL Eq. 17; CReFF's server).

    ``items`` are ``(grads, present)`` pairs as :func:`class_gradients` returns them; the result
    has the same layout, ``present`` being the union.
    """
    acc = ClassGradientMean(plain=True)
    for grads, present in items:
        acc.add(grads, present)
    return acc.result()


def _cosine_distance(real: torch.Tensor, syn: torch.Tensor) -> torch.Tensor:
    """Σ over the last-but-one dims of 1 − cos along the last dim (rows of W, or the bias vector)."""
    dot = (real * syn).sum(-1)
    return (1 - dot / (real.norm(dim=-1) * syn.norm(dim=-1) + COS_EPS)).sum()


def _matching_distance(
    real: Mapping[str, torch.Tensor], classes: torch.Tensor, g_w: torch.Tensor, g_b: torch.Tensor
) -> torch.Tensor:
    """The matching loss of the present ``classes``' synthetic gradients against the real ones."""
    return _cosine_distance(real["weight"][classes], g_w) + _cosine_distance(real["bias"][classes], g_b)


class FederatedFeatures:
    """m synthetic features per class, kept across rounds (MuPFL Eq. 19-20; CReFF).

    Initialised once from N(0, σ²), σ = ``init_std`` (1 in the authors' code), and refined every round by
    :meth:`match`, which runs plain SGD on the features so that the classifier gradient each
    class's features induce matches the aggregated real gradient in cosine distance:

        L = Σ_{c present} [ Σ_r (1 − cos(g_W^c[r], ĝ_W^c[r])) + (1 − cos(g_b^c, ĝ_b^c)) ],

    g = real (aggregated) gradient, ĝ = gradient of the mean CE of class c's m features under
    the given classifier. Classes no client reported this round keep their features.
    """

    def __init__(
        self,
        num_classes: int,
        feature_dim: int,
        per_class: int,
        generator: torch.Generator,
        *,
        lr: float = 0.1,
        iterations: int = 100,
        init_std: float = 1.0,
    ) -> None:
        self.num_classes = int(num_classes)
        self.per_class = int(per_class)
        self.lr = float(lr)
        self.iterations = int(iterations)
        # With fewer features than dimensions (C·m < D), unit-variance noise lets the re-trained
        # classifier separate the features by their noise alone; a smaller σ leaves the matched
        # directions dominant (benchmarks/mupfl/feature_init_validation.py).
        # Drawn on the generator's device (the CPU), and kept there between rounds: :meth:`match` and
        # :func:`train_classifier` move them to the classifier's device while they compute.
        self.features = torch.randn(num_classes * per_class, feature_dim, generator=generator,
                                    device=generator.device) * init_std
        self.labels = torch.arange(num_classes, device=self.features.device).repeat_interleave(per_class)

    def loss(
        self,
        classifier: nn.Linear,
        real: Mapping[str, torch.Tensor],
        present: torch.Tensor,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The matching loss above, for ``features`` (default: the stored ones).

        Differentiable w.r.t. ``features``; the classifier enters detached (it is only read).
        """
        classes = present.to(torch.bool).nonzero().flatten()
        feats = (self.features if features is None else features).view(self.num_classes, self.per_class, -1)
        if len(classes) == 0:
            return feats.sum() * 0.0
        syn = feats if len(classes) == self.num_classes else feats[classes]  # [P, m, D], no copy if all
        labels = classes.view(-1, 1).expand(-1, self.per_class)
        weight, bias = classifier.weight.detach(), classifier.bias.detach()
        g_w, g_b = linear_ce_gradients(weight, bias, syn, labels)  # all present classes at once
        return _matching_distance(real, classes, g_w, g_b)

    def match(
        self, classifier: nn.Linear, real: Mapping[str, torch.Tensor], present: torch.Tensor
    ) -> tuple[float, float]:
        """Run ``iterations`` SGD steps (lr ``lr``) on the features; return (loss before, loss after).

        Plain SGD without momentum, as the authors' feature optimiser, so no optimiser state
        needs keeping between rounds. The classifier is read, never changed. Runs on the
        classifier's device; the features come back to where they were kept (the CPU).
        """
        home, device = self.features.device, classifier.weight.device
        real = {k: v.to(device) for k, v in real.items()}
        classes = present.to(torch.bool).nonzero().flatten().to(device)  # read once, not per step
        # updated in place below; the old tensor may be in a message
        self.features = self.features.to(device, copy=True)
        before = None
        for _ in range(self.iterations):
            loss = self._step(classifier, real, classes)
            if before is None:
                before = loss
        with torch.no_grad():
            after = float(self.loss(classifier, real, present.to(device)))
        self.features = self.features.to(home)
        return (after if before is None else float(before)), after

    def _step(
        self, classifier: nn.Linear, real: Mapping[str, torch.Tensor], classes: torch.Tensor
    ) -> torch.Tensor | float:
        """One SGD step on the features, in place, for the present ``classes`` (sorted class ids);
        returns the loss before it (a 0-dim tensor).

        The gradient is :meth:`loss`'s, in closed form. With H a class's m features, z = HWᵀ + b,
        p = softmax(z), r = (p − onehot)/m, g_W = rᵀH, g_b = Σ_i r_i, and A = ∂L/∂g_W, a = ∂L/∂g_b
        (autograd, on these small C × D tensors only):

            ∂L/∂H = r A + (p ⊙ (s − ⟨p, s⟩)) W,   s = (H Aᵀ + a) / m.

        Autograd through the whole loss gives the same (a test checks it) but materialises several
        C·m × D intermediates a step; this reads H three times and updates it in place.
        """
        if len(classes) == 0:
            return 0.0
        every = len(classes) == self.num_classes
        feats = self.features.view(self.num_classes, self.per_class, -1)
        h = feats if every else feats[classes]  # [P, m, D]
        weight, bias = classifier.weight.detach(), classifier.bias.detach()
        with torch.no_grad():
            p = torch.softmax(F.linear(h, weight, bias), dim=-1)  # [P, m, C]
            onehot = F.one_hot(classes, weight.shape[0]).to(p.dtype).unsqueeze(1)
            r = (p - onehot) / self.per_class
            g_w = (r.transpose(-1, -2) @ h).requires_grad_(True)
            g_b = r.sum(-2).requires_grad_(True)
        with torch.enable_grad():
            loss = _matching_distance(real, classes, g_w, g_b)
            d_w, d_b = torch.autograd.grad(loss, (g_w, g_b))
        with torch.no_grad():
            s = torch.baddbmm(d_b.unsqueeze(-2), h, d_w.transpose(-1, -2)) / self.per_class
            d_z = p * (s - (p * s).sum(-1, keepdim=True))
            left = torch.cat([r, d_z], dim=-1)  # [P, m, 2C]
            right = torch.cat([d_w, weight.expand(len(classes), -1, -1)], dim=-2)  # [P, 2C, D]
            h.baddbmm_(left, right, alpha=-self.lr)
            if not every:
                feats[classes] = h
        return loss.detach()

    def state_dict(self) -> dict[str, Any]:
        # Hyper-parameters come from the constructor (the run's options), not from the state.
        return {"features": self.features.clone(), "labels": self.labels.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        features = state["features"]
        if features.shape[0] != self.num_classes * self.per_class:
            raise ValueError(f"expected {self.num_classes * self.per_class} features, got {features.shape[0]}")
        self.features = features.detach().clone()
        self.labels = state["labels"].clone()


@torch.no_grad()
def reset_linear(layer: nn.Linear, generator: torch.Generator) -> None:
    """Re-draw ``layer`` as PyTorch's default init does (U(±1/√fan_in) for weight and bias), drawn on
    ``generator``'s device (the CPU: every device draws the same) and copied into the layer."""
    bound = layer.in_features ** -0.5
    for p in (layer.weight, layer.bias):
        if p is not None:
            p.copy_(torch.empty(p.shape, dtype=p.dtype, device=generator.device).uniform_(-bound, bound, generator=generator))


@torch.no_grad()
def train_classifier(
    classifier: nn.Linear,
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> None:
    """Plain SGD on (features, labels) updating only ``classifier``, in place (MuPFL Eq. 21; CReFF).

    Shuffled mini-batches each epoch (the last one may be smaller), no momentum or weight
    decay, as the authors' re-training. Uses the closed-form gradient, so the many tiny steps
    (300 epochs of batch 32) cost a matmul each and no autograd bookkeeping.
    """
    weight, bias = classifier.weight, classifier.bias
    device = weight.device  # the features and labels move there once; the orders are drawn on the CPU
    features, labels = features.detach().to(device), labels.to(device)
    onehot = F.one_hot(labels, weight.shape[0]).to(weight.dtype)
    n = len(labels)
    # Every epoch's order drawn first, in the order the epochs would draw them, and moved at once.
    orders = to_like(torch.stack([torch.randperm(n, generator=generator, device=generator.device)
                                  for _ in range(epochs)]), weight) if epochs else []  # fmt: skip
    for order in orders:
        # A gather per batch, not one of the whole shuffled set per epoch: that copy (C·m × D
        # floats, 50 MB at m 400 on cnn-fmnist) cost more than the steps; the values are the same.
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            h = features.index_select(0, index)
            logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())
            residual = logits.softmax(-1).sub_(onehot.index_select(0, index)).mul_(1.0 / len(h))
            weight.addmm_(residual.t(), h, alpha=-lr)  # W -= lr · rᵀh
            if bias is not None:
                bias.sub_(residual.sum(0), alpha=lr)
