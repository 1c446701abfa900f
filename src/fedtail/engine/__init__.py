"""The simulation engine: data preparation, executors, the round loop."""

from __future__ import annotations

from fedtail.config import RunConfig
from fedtail.components import load_dataset
from fedtail.data.base import Dataset
from fedtail.partition import Partition, make_partition


def prepare(config: RunConfig) -> tuple[Dataset, Partition]:
    """Load the dataset and cut it into clients; raises FedtailError on bad input."""
    dataset = load_dataset(config.dataset, config.data_dir, **config.dataset_options)
    config.partition.check(dataset.num_classes)
    ids = lambda split: None if split.clients is None else split.clients.numpy().copy()  # noqa: E731
    partition = make_partition(
        dataset.train.labels,
        dataset.test.labels,
        dataset.num_classes,
        config.partition,
        config.seed,
        train_clients=ids(dataset.train),
        test_clients=ids(dataset.test),
    )
    return dataset, partition


__all__ = ["prepare"]
