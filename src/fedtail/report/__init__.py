"""Run folders (config, metrics, summary) and, later, tables and plots built from them."""

from fedtail.report.runfiles import RunWriter, is_finished

__all__ = ["RunWriter", "is_finished"]
