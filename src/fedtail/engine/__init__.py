"""The simulation engine: data preparation, executors, the round loop."""

from __future__ import annotations

from fedtail.config import RunConfig
from fedtail.components import load_dataset
from fedtail.data.base import Dataset
from fedtail.errors import ConfigError
from fedtail.partition import Partition, make_partition


def prepare(config: RunConfig, run: bool = True, server: bool = True) -> tuple[Dataset, Partition]:
    """Load the dataset and cut it into clients; raises FedtailError on bad input (``run``: also
    unless the algorithm and the model fit the dataset's task; ``fedtail partition`` uses neither;
    ``server`` False: a Flower node's, which checks no DP accountant, see :func:`guard.check`).

    Segmentation datasets are cut by each image's primary class, over the classes but the background.
    """
    dataset = load_dataset(config.dataset, config.data_dir, **config.dataset_options)
    if run:
        check_task(config, dataset, server)
    classes = dataset.partition_classes
    if config.partition.scheme == "semantic" and not dataset.segmentation:
        raise ConfigError(f"--partition semantic relabels segmentation masks; {config.dataset!r} is a classification dataset")
    if config.partition.scheme == "semantic" and dataset.background is None:
        raise ConfigError(f"--partition semantic needs a background class, which {config.dataset!r} has not")
    config.partition.check(classes)
    ids = lambda split: None if split.clients is None else split.clients.numpy().copy()  # noqa: E731
    partition = make_partition(
        dataset.train.labels,
        dataset.test.labels,
        classes,
        config.partition,
        config.seed,
        train_clients=ids(dataset.train),
        test_clients=ids(dataset.test),
    )
    if dataset.segmentation:
        from fedtail.data.segmentation import pixel_counts

        partition.pixel_counts = pixel_counts(dataset.train.y[partition.kept], dataset.num_classes)[:classes]
    return dataset, partition


def check_task(config: RunConfig, dataset: Dataset, server: bool = True) -> None:
    """ConfigError unless the algorithm runs the dataset's task and the model predicts its kind of output,
    and takes the run's --aggregate and --dp-clip."""
    from fedtail.components import algorithm, build_model
    from fedtail.engine import guard

    spec = algorithm(config.algorithm)
    guard.check(config, spec, server)
    if dataset.task not in spec.tasks:
        why = spec.why_not.get(dataset.task)
        raise ConfigError(
            f"{config.algorithm} does not run {dataset.task} ({config.dataset})" + (f": {why}" if why else "")
            + f"; it runs {', '.join(spec.tasks)} (`fedtail list` names the algorithms of each task)"
        )
    if dataset.segmentation:
        for refused, why in (
            (config.plan.has_stages, "--partition stages (stage tasks of classes)"),
            (config.class_probabilities, "--class-probabilities (per-image class probabilities)"),
        ):
            if refused:
                raise ConfigError(f"{why} is for classification; {config.dataset} is a segmentation dataset")
    elif config.sample_masks:
        raise ConfigError(f"--sample-masks writes predicted masks of a segmentation run; {config.dataset} is a classification dataset")
    dense = getattr(build_model(config.model, dataset.input_shape, dataset.num_classes, config.head), "dense", False)
    if dense != dataset.segmentation:
        want = "a segmentation model (seg-tiny, mobilenetv3-small-seg)" if dataset.segmentation else "a classifier"
        raise ConfigError(f"--model {config.model} does not fit {config.dataset}, a {dataset.task} dataset: use {want}")


__all__ = ["check_task", "prepare"]
