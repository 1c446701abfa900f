"""Evaluation metrics and the run-level record (best, final, rounds-to-accuracy, costs)."""

from fedtail.metrics.accuracy import global_metrics, personalized_metrics, rounds_to_accuracy
from fedtail.metrics.record import Meter, RunRecord

__all__ = ["Meter", "RunRecord", "global_metrics", "personalized_metrics", "rounds_to_accuracy"]
