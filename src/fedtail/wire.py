"""The engine's wire conventions, named once: what the engine reads in a reply.

A :class:`~fedtail.algorithms.base.Message` carries named tensors and numbers; an algorithm's own
payload keys are constants at the top of its module. The few the engine itself writes and reads
are named here, and the engine, the algorithms and Flower's codec use these names:

- a training reply's **metrics** (written by ``ctx.reply``): :data:`NUM_EXAMPLES`, the client's
  training-set size, which most methods weight their means by (``reply.num_examples``);
  :data:`NUM_SAMPLES` and :data:`NUM_STEPS`, the samples and steps trained by the call; and
  :data:`TRAIN_LOSS`, their mean cross-entropy. The engine sums the round's training loss and
  samples from the accepted replies.
- an **evaluation reply's tensors** (written by ``ctx.evaluate``, read by the engine into
  accuracies): per-class counts :data:`CORRECT` and :data:`TOTAL`, shaped (classes,).
  :func:`correct_key` names the counts of a named accuracy (``correct:NAME``: several prediction
  rules of one model). With stage tasks there are the same per seen stage, shaped
  (stages, classes), under :func:`stage_key`. A segmentation task's replies add :data:`CONFUSION`,
  the pixel confusion matrix (classes × classes, true by predicted), whose diagonal and row
  sums the per-class counts are, and at the final evaluation of a run with ``--sample-masks K``
  :data:`EVAL_MASKS`, the predicted masks of the client's first K evaluation images. At a round of ``--similarity-rounds`` it also holds
  :data:`EVAL_MODEL`, the evaluated model's parameters as one flat vector
  (:mod:`fedtail.metrics.similarity`).
"""

from __future__ import annotations

from typing import Mapping

import torch

NUM_EXAMPLES = "num_examples"  # metrics: the client's training samples (the usual aggregation weight)
NUM_SAMPLES = "num_samples"  # metrics: samples trained by this call (epochs × data, or steps × batch)
NUM_STEPS = "num_steps"  # metrics: optimizer steps of this call
TRAIN_LOSS = "train_loss"  # metrics: mean cross-entropy of those samples (absent when nothing trained)

CORRECT = "correct"  # evaluation tensors: correct predictions per class
TOTAL = "total"  # evaluation tensors: evaluated samples per class
NAMED = "correct:"  # evaluation tensors: "correct:NAME", the counts of the named accuracy NAME
BY_STAGE = "stage_"  # evaluation tensors: the per-stage arrays, "stage_correct", "stage_total", ...
CONFUSION = "confusion"  # evaluation tensors, segmentation: pixels per (true class, predicted class)
EVAL_MASKS = "predicted_masks"  # evaluation tensors, segmentation, final round with --sample-masks K: (K, H, W) uint8
EVAL_MODEL = "evaluated_model"  # evaluation tensors at similarity rounds: the scored model, flattened


def correct_key(name: str = "") -> str:
    """The tensor of correct counts of the named accuracy ``name`` (the headline's: ``name`` empty)."""
    return NAMED + name if name else CORRECT


def stage_key(key: str) -> str:
    """The per-stage counterpart of an evaluation tensor (``stage_correct``, ``stage_correct:NAME``, ...)."""
    return BY_STAGE + key


def named_accuracies(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the named accuracies an evaluation reply carries, in its order."""
    return [key[len(NAMED) :] for key in tensors if key.startswith(NAMED)]


def eval_tensors(
    correct: torch.Tensor,
    total: torch.Tensor,
    named: Mapping[str, torch.Tensor] | None = None,
    by_stage: tuple[torch.Tensor, torch.Tensor] | None = None,
    named_by_stage: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """An evaluation reply's tensors from its counts (``by_stage``: the per-stage correct and total)."""
    tensors = {CORRECT: correct, TOTAL: total}
    tensors |= {correct_key(name): c for name, c in (named or {}).items()}
    if by_stage is not None:
        tensors |= {stage_key(CORRECT): by_stage[0], stage_key(TOTAL): by_stage[1]}
        tensors |= {stage_key(correct_key(name)): c for name, c in (named_by_stage or {}).items()}
    return tensors
