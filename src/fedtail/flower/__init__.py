"""Running any fedtail algorithm across machines on Flower (``pip install -e ".[flower]"``).

The simulator's round loop is reused as it is: the ServerApp builds the same
:class:`~fedtail.engine.simulation.Simulation` (sampling, the algorithm's server half through
:class:`~fedtail.engine.simulation.SimComm` and its :class:`~fedtail.engine.replies.Channel`,
evaluation, the run folder) with its executor replaced by :class:`~fedtail.flower.server.GridExecutor`,
which sends each exchange's client tasks to the SuperNodes hosting those clients, one Flower
message per node, and hands back their results in client-id order. A SuperNode's ClientApp
(:mod:`fedtail.flower.node`) runs the tasks with the engine's own
:class:`~fedtail.engine.executors.ClientRuntime` (same seeds: ``derive_seed(seed, round, call,
client)``) on the clients' data cut from the same seeded partition, and keeps each client's
state on disk, so results equal the simulator's.

Modules:

- :mod:`~fedtail.flower.codec`: fedtail messages <-> Flower records (ArrayRecord, ConfigRecord,
  MetricRecord), and the bytes a Flower message puts on the wire;
- :mod:`~fedtail.flower.node`: the ClientApp's work: node config, the client state on disk;
- :mod:`~fedtail.flower.server`: the ServerApp's work: the node map, the grid executor;
- :mod:`~fedtail.flower.apps`: the ``ServerApp`` and ``ClientApp`` objects Flower loads;
- :mod:`~fedtail.flower.deploy`: the app folder, certificates and node keys, a loopback deployment.

Nothing outside this package imports Flower, and this package imports it only where it is used,
so fedtail works without it.
"""

from __future__ import annotations

from fedtail.errors import FedtailError


class FlowerError(FedtailError):
    """A Flower deployment that cannot start or went wrong (missing package, nodes, certificates)."""


def require_flwr() -> None:
    """Raise a clear error when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise FlowerError(
            "Flower is not installed: pip install -e \".[flower]\" (or make install-flower)"
        ) from None
