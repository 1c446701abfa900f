"""BAVD: Biased Activation Value Dropout (MuPFL, Sec. 3.3, Eq. 6).

Each client keeps one activation map per BAVD layer, accumulated over its training steps λ:

    M^(0) = h̄^(0),    M^(λ) = M^(λ−1) + ψ^(λ) · h̄^(λ),    ψ^(λ) = s · (ℓ^(λ) − ℓ^(λ−1)),

where h̄ is the layer's activation averaged over the batch (a C×H×W map: the paper types M as
H×W, but a per-position map is the reading that lets positions be dropped individually) and
s = ``psi_sign`` (+1 is the equation as written; the prose suggests the opposite reading, so the
sign is an option). In training, the map is min–max normalised, its mean is the threshold,
and activations at positions below the threshold are zeroed; at evaluation the layer is the
identity. The map persists across rounds (it lives in the client's state) and is uploaded
for ACMU's similarity.

Implemented with forward hooks on the body's activation modules, so any model works
without rebuilding it and the state_dict keys do not change.

Missing replies: a client that does not reply keeps its maps as they were (its state does not
change), and its next training continues them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ReLU6)


def activation_modules(body: nn.Module) -> list[nn.Module]:
    """The body's activation modules in forward order (where BAVD layers can go)."""
    return [m for m in body.modules() if isinstance(m, ACTIVATIONS)]


def keep_mask(activation_map: torch.Tensor) -> torch.Tensor:
    """Positions whose min–max normalised map value reaches the map's mean (Sec. 3.3)."""
    low, high = activation_map.min(), activation_map.max()
    span = high - low
    if span <= 0:  # a flat map carries no preference: keep everything
        return torch.ones_like(activation_map, dtype=torch.bool)
    normalised = (activation_map - low) / span
    return normalised >= normalised.mean()


class ActivationMaps:
    """One client's BAVD maps, updated step by step while hooked into a model.

    ``maps[k]`` belongs to the k-th selected activation module; ``last_loss`` is ℓ^(λ−1).
    Both persist across rounds in the client's state (see :meth:`state` / :meth:`from_state`).
    """

    def __init__(self, layers: list[int], psi_sign: float = 1.0, rescale: bool = False) -> None:
        self.layers = layers
        self.psi_sign = psi_sign
        self.rescale = rescale
        self.maps: list[torch.Tensor | None] = [None] * len(layers)
        self.last_loss: float | None = None
        self._batch_means: list[torch.Tensor | None] = [None] * len(layers)

    # -- persistence --------------------------------------------------------------------------
    def state(self) -> dict:
        return {"maps": self.maps, "last_loss": self.last_loss}

    @classmethod
    def from_state(
        cls, layers: list[int], psi_sign: float, state: dict | None, rescale: bool = False
    ) -> "ActivationMaps":
        maps = cls(layers, psi_sign, rescale)
        if state:
            maps.maps = [None if m is None else m.clone() for m in state["maps"]]
            maps.last_loss = state["last_loss"]
        return maps

    def flat(self) -> torch.Tensor:
        """All maps as one vector (what ACMU compares); empty before the first step."""
        parts = [m.flatten() for m in self.maps if m is not None]
        return torch.cat(parts) if parts else torch.zeros(0)

    # -- training -----------------------------------------------------------------------------
    def _hook(self, k: int):
        def hook(module: nn.Module, inputs, output: torch.Tensor):
            if not module.training:
                return None  # identity at evaluation
            # The map accumulates the activation before masking, so a dropped position can recover.
            self._batch_means[k] = output.detach().mean(dim=0)
            current = self.maps[k]
            if current is None:
                return None  # λ = 0: no map yet, nothing to drop
            keep = keep_mask(current).to(output.dtype)
            if self.rescale:
                keep = keep / keep.mean()
            return output * keep

        return hook

    def on_step(self, loss: float) -> None:
        """Fold this step's batch-mean activations into the maps (Eq. 6)."""
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
