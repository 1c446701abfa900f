"""Models split into a feature extractor (``body``) and a classifier (``head``).

Build one with :func:`build_model`; :data:`MODELS` lists the names with a one-line description.
"""

from fedtail.models.base import SplitModel
from fedtail.models.registry import MODELS, build_model

__all__ = ["MODELS", "SplitModel", "build_model"]
