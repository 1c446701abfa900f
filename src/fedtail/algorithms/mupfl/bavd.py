"""BAVD: Biased Activation Value Dropout (MuPFL, Sec. 3.3, Eq. 6).

Each client keeps one activation map per BAVD layer, accumulated over its training steps λ:

    M^(0) = h̄^(0),    M^(λ) = M^(λ−1) + ψ^(λ) · h̄^(λ),    ψ^(λ) = s · (ℓ^(λ) − ℓ^(λ−1)),     (Eq. 6)

where h̄ is the layer's activation averaged over the batch and s = ``psi_sign`` (+1 is the
equation as written). The map is min–max normalised and its mean μ is the threshold. The map
lives in the client's state and is uploaded for ACMU's similarity; it runs over every step of
every round, or starts again each local epoch or round (``source`` below). At evaluation the
layer is the identity unless ``eval_mask`` says otherwise. Batch λ is masked with M^(λ−1), the
map before its own step (ℓ^(λ) needs the masked forward pass, so M^(λ) cannot mask batch λ); the
first batch after a map starts again is therefore not masked.

The text leaves open what exactly is compared with μ, and each reading is an option. MuPFL's
defaults (``MuPFLConfig``: BAVD off; when on, ``mask = "value"``, ``source = "epoch"``,
``shape = "chw"``, ψ sign −1, not rescaled, last activation) are the best reading on validation
data at the test runs' budget and lr 0.01 (``benchmarks/mupfl/README.md``, "BAVD at lr 0.01";
at lr 0.005 it was the batch mask, rescaled, which diverges at 0.01); this class's own
defaults are Eq. 6 as written (accumulated map, ψ as written, no rescaling).

- ``mask = "map"``: positions whose *normalised map value* is below μ are zeroed, the same positions for every
  sample. "Activation values h_icbd below this threshold μ_i are zeroed (h_icbd → 0) within
  the forward pass feature map M^norm_i" read as "the positions of M^norm_i below μ_i".
  With an accumulated map this is close to a fixed mask (issue 16: 80–97 % agreement with
  "keep the top third of the mean activation").
- ``mask = "value"``: each activation is compared with μ by its *own value*, min–max normalised
  within its H×W slice (per sample and channel; per sample for a flat layer), so every input
  keeps its own highest activations. The sentences that decide for it: BAVD "selectively
  preserves features with the highest values based on a client-specific activation map"
  (Sec. 3.3), "Activation values h_icbd below this threshold μ_i are zeroed" (the values, not
  the map), "topK algorithm conducts a partial sort to locate the top K values in each H×W area
  of the batch and channel dimensions ... across all B×C slices" (Sec. 3.6: a per-sample,
  per-channel selection), and the motivating variant of FedAvg "which retains only high
  activation values" (Sec. 3.1). The map then sets how much is kept (μ), not where.
- ``source`` says over which steps the map of Eq. 6 runs, and so what the mask comes from:
  ``"accumulated"``, over every step of every round (the map never starts again); ``"epoch"``, it
  starts again (λ = 0) at every local epoch, as "λ representing the specific training iteration
  for each batch within a given local epoch" (Sec. 3.3) and "updating activation maps personalized
  to each local model's epoch" (Sec. 1) read; ``"round"``, it starts again at every round, as
  Algorithm 1 hands CLIENTUPDATE the initial map M_i0 (line 6) and the client returns the map it
  made (line 21); ``"batch"`` (the reading chosen at lr 0.005; rescaled, it diverges at 0.01),
  the mask comes from this batch's mean activation alone (M^(0) of Eq. 6 every step), the
  uploaded map following Eq. 6 accumulated.
  With ``"epoch"`` / ``"round"`` the uploaded map is the one of the last epoch / of the round.
- ``eval_mask``: at evaluation the layer applies the mask of the client's stored map too (not
  rescaled), the variant of Sec. 3.1 "which retains only high activation values"; otherwise (the
  default) it is the identity at evaluation, as a dropout layer is.
- ``shape = "hw"``: the map is averaged over channels, H×W as the paper types M; ``"chw"``
  (default) keeps one value per position of every channel.
- ``psi_sign``: the prose says "A negative coefficient ψ indicates detrimental prediction
  outcomes, while a positive coefficient ψ signifies contribution to model training", the
  opposite of ℓ^(λ) − ℓ^(λ−1) (a rising loss gives a positive ψ), so the sign is an option.
- ``rescale``: divide the kept activations by the kept fraction (inverted dropout, as the
  dropout layer BAVD replaces does).

The map accumulates the activation before masking, so a dropped position can recover.

Implemented with forward hooks on the body's activation modules, so any model works
without rebuilding it and the state_dict keys do not change.

Missing replies: a client that does not reply keeps its maps as they were (its state does not
change), and its next training continues them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal

import torch
from torch import nn

from fedtail.algorithms.base import StepHook

ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ReLU6, nn.Hardswish)  # Hardswish: MobileNet-V3's

Mask = Literal["map", "value"]
Source = Literal["accumulated", "batch", "epoch", "round"]
Shape = Literal["chw", "hw"]


def activation_modules(body: nn.Module) -> list[nn.Module]:
    """The body's activation modules in forward order (where BAVD layers can go)."""
    return [m for m in body.modules() if isinstance(m, ACTIVATIONS)]


def normalise(x: torch.Tensor) -> torch.Tensor | None:
    """Min–max normalised to [0, 1], or None for a flat tensor (no preference)."""
    low, high = x.min(), x.max()
    span = high - low
    if span <= 0:
        return None
    return (x - low) / span


def threshold(activation_map: torch.Tensor) -> float:
    """μ: the mean of the min–max normalised map (0 for a flat map: everything is kept)."""
    normalised = normalise(activation_map)
    return 0.0 if normalised is None else float(normalised.mean())


def keep_mask(activation_map: torch.Tensor) -> torch.Tensor:
    """Positions whose min–max normalised map value reaches the map's mean (``mask = "map"``)."""
    normalised = normalise(activation_map)
    if normalised is None:  # a flat map carries no preference: keep everything
        return torch.ones_like(activation_map, dtype=torch.bool)
    return normalised >= normalised.mean()


def value_mask(h: torch.Tensor, mu: float) -> torch.Tensor:
    """Activations whose value, min–max normalised within its slice, reaches μ (``mask = "value"``).

    A slice is one sample's H×W plane of one channel (Sec. 3.6's B×C slices), or one sample's
    features for a flat layer. A flat slice keeps everything.
    """
    dims = tuple(range(2, h.dim())) if h.dim() > 2 else (1,)
    low, high = h.amin(dim=dims, keepdim=True), h.amax(dim=dims, keepdim=True)
    span = high - low
    normalised = (h - low) / span.clamp_min(torch.finfo(h.dtype).tiny)
    return (normalised >= mu) | (span <= 0)


def channel_mean(x: torch.Tensor) -> torch.Tensor:
    """A per-sample-averaged C×H×W activation as an H×W map (``shape = "hw"``); flat maps unchanged."""
    return x.mean(0) if x.dim() > 1 else x


class ActivationMaps:
    """One client's BAVD maps, updated step by step while hooked into a model.

    ``maps[k]`` belongs to the k-th selected activation module; ``last_loss`` is ℓ^(λ−1).
    Both persist across rounds in the client's state (see :meth:`state` / :meth:`from_state`).
    """

    def __init__(
        self,
        layers: list[int],
        psi_sign: float = 1.0,
        rescale: bool = False,
        *,
        mask: Mask = "map",
        source: Source = "accumulated",
        shape: Shape = "chw",
        eval_mask: bool = False,
    ) -> None:
        self.layers = layers
        self.psi_sign = psi_sign
        self.rescale = rescale
        self.mask = mask
        self.source = source
        self.shape = shape
        self.eval_mask = eval_mask
        self.maps: list[torch.Tensor | None] = [None] * len(layers)
        self.last_loss: float | None = None
        self._batch_means: list[torch.Tensor | None] = [None] * len(layers)

    # -- persistence --------------------------------------------------------------------------
    def state(self) -> dict:
        return {"maps": self.maps, "last_loss": self.last_loss}

    def load(self, state: dict | None) -> "ActivationMaps":
        """Continue from a client's stored maps (copies: the stored state is not changed)."""
        if state:
            self.maps = [None if m is None else m.clone() for m in state["maps"]]
            self.last_loss = state["last_loss"]
        return self

    def hook(self, per_epoch: bool = False) -> StepHook:
        """The maps as ``ctx.train(hook=...)``: each step folded in (:meth:`on_step`); with
        ``per_epoch``, started again before every pass over the data (:meth:`reset`)."""
        return _MapSteps(self, per_epoch)

    def reset(self, epoch: int | None = None) -> None:
        """Start the maps again (λ = 0 of Eq. 6): at a local epoch (``source = "epoch"``, as
        before each pass) or a round (``"round"``)."""
        self.maps = [None] * len(self.layers)
        self.last_loss = None

    @classmethod
    def from_state(
        cls, layers: list[int], psi_sign: float, state: dict | None, rescale: bool = False, **reading
    ) -> "ActivationMaps":
        return cls(layers, psi_sign, rescale, **reading).load(state)

    def flat(self) -> torch.Tensor:
        """All maps as one vector (what ACMU compares); empty before the first step."""
        parts = [m.flatten() for m in self.maps if m is not None]
        return torch.cat(parts) if parts else torch.zeros(0, device="cpu")

    # -- training -----------------------------------------------------------------------------
    def _keep(self, output: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        if self.mask == "value":
            return value_mask(output.detach(), threshold(reference))
        return keep_mask(reference)  # C×H×W, or H×W broadcast over the channels

    def _hook(self, k: int):
        def hook(module: nn.Module, inputs, output: torch.Tensor):
            if not module.training:  # the identity at evaluation, or the stored map's mask, not rescaled
                if not self.eval_mask or self.maps[k] is None:
                    return None
                return output * self._keep(output, self.maps[k]).to(output.dtype)
            mean = output.detach().mean(dim=0)
            if self.shape == "hw":
                mean = channel_mean(mean)
            self._batch_means[k] = mean
            reference = mean if self.source == "batch" else self.maps[k]
            if reference is None:
                return None  # λ = 0 of an accumulated map: no map yet, nothing to drop
            keep = self._keep(output, reference).to(output.dtype)
            if self.rescale:
                keep = keep / keep.mean().clamp_min(torch.finfo(keep.dtype).tiny)
            return output * keep

        return hook

    def on_step(self, loss: torch.Tensor) -> None:
        """Fold this step's batch-mean activations into the maps (Eq. 6)."""
        loss = float(loss)  # ψ is the scalar weight of Eq. 6's sum (on a GPU: one wait per step)
        psi = None if self.last_loss is None else self.psi_sign * (loss - self.last_loss)
        for k, mean in enumerate(self._batch_means):
            if mean is None:
                continue
            if self.maps[k] is None:
                self.maps[k] = mean.clone()  # λ = 0
            elif psi is not None:
                self.maps[k].add_(mean, alpha=psi)
            self._batch_means[k] = None
        self.last_loss = loss

    @contextmanager
    def attached(self, model: nn.Module) -> Iterator["ActivationMaps"]:
        """Hook the maps into ``model.body`` for the duration of a training pass."""
        modules = activation_modules(model.body)
        try:
            chosen = [modules[i] for i in self.layers]
        except IndexError:
            raise ValueError(
                f"BAVD layers {self.layers} do not exist: the body has {len(modules)} activation layers"
            ) from None
        handles = [m.register_forward_hook(self._hook(k)) for k, m in enumerate(chosen)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self._batch_means = [None] * len(self.layers)


class _MapSteps(StepHook):
    """:meth:`ActivationMaps.hook`: the maps updated after every step of local training."""

    def __init__(self, maps: ActivationMaps, per_epoch: bool) -> None:
        self.maps = maps
        self.per_epoch = per_epoch

    def before_epoch(self, epoch: int) -> None:
        if self.per_epoch:
            self.maps.reset(epoch)

    def after_step(self, loss: torch.Tensor) -> None:
        self.maps.on_step(loss)
