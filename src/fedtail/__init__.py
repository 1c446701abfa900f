"""fedtail: personalized federated learning on non-IID, long-tailed and growing client data."""

__version__ = "0.1.0"
