"""fedtail: personalized federated learning on non-IID, long-tailed and growing client data.

From Python: ``fedtail.run(**flags)``, ``fedtail.load_run(DIR)``, ``fedtail.load_runs(ROOT)`` (a
pandas DataFrame, one row per run), ``fedtail.sweep(FILE)``,
``fedtail.Callback`` for ``fedtail.run(..., callbacks=[...])`` (see
:mod:`fedtail.api`, which also holds the contract a plug-in algorithm codes against). Importing
``fedtail`` alone stays light: the API (and torch) load on first use.
"""

from fedtail.errors import ConfigError, DataError, FedtailError, RunDiverged

__version__ = "0.1.0"

_API = ("run", "load_run", "load_runs", "RunResult", "config_from_flags", "Callback")


def __getattr__(name: str):
    if name in _API:
        from fedtail import api

        return getattr(api, name)
    if name == "sweep":  # the sweep package, which is callable: fedtail.sweep(FILE) runs a sweep file
        import fedtail.sweep as package

        return package
    raise AttributeError(f"module 'fedtail' has no attribute {name!r}")


__all__ = ["Callback", "ConfigError", "DataError", "FedtailError", "RunDiverged", "RunResult", "load_run", "load_runs", "run", "sweep"]
