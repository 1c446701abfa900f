"""Models split into a feature extractor (``body``) and a classifier (``head``).

Build one with :func:`build_model`; :data:`MODELS` lists the names with a one-line description.
"""

from fedtail.models.base import HEAD_SPLITS, SplitModel
from fedtail.models.registry import HEADS, MODELS, build_model, describe_heads, head_layers, own_head

__all__ = ["HEADS", "HEAD_SPLITS", "MODELS", "SplitModel", "build_model", "describe_heads", "head_layers", "own_head"]
