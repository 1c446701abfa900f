"""Algorithm registry: each algorithm is one module with a server half and a client half."""

from fedtail.algorithms.base import Algorithm, AlgorithmConfig, ClientHalf, EdgeHalf, Message, ServerHalf

# Importing an algorithm module registers it.
from fedtail.algorithms import fedavg, local  # noqa: E402,F401

ALGORITHMS: dict[str, Algorithm] = Algorithm.registry

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "ClientHalf", "EdgeHalf", "Message", "ServerHalf"]
