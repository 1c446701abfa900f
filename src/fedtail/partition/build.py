"""`make_partition`: server carve -> long-tail cut -> scheme -> holdout/validation carve -> local test views."""

from __future__ import annotations

import numpy as np

from fedtail.errors import ConfigError
from fedtail.partition import local_test, schemes
from fedtail.partition.config import PartitionConfig
from fedtail.partition.longtail import apply_longtail
from fedtail.partition.partition import ClientData, Partition, ServerData, StageData

_SCHEME_FUNCS = {
    "iid": schemes.iid,
    "dirichlet": schemes.dirichlet,
    "pathological": schemes.pathological,
    "dominant": schemes.dominant,
}

# What to change when a client (or stage) ends up with no training data, per scheme.
_EMPTY_HINT = {
    "iid": "use fewer --clients",
    "dirichlet": "use fewer --clients or a larger --alpha",
    "pathological": "use fewer --clients, more --classes-per-client or a smaller --imbalance",
    "dominant": "use fewer --clients",
    "stages": "use fewer --clients or a smaller --imbalance, or --balanced (equal-size shards)",
    "natural": "use a smaller --imbalance (the long-tail cut emptied a client)",
    "semantic": "use fewer --clients, more --classes-per-client or a smaller --imbalance",
}


def _check_labels(labels: np.ndarray, num_classes: int, name: str) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"{name} labels must be a 1-D integer array (got shape {arr.shape}, {arr.dtype})")
    if len(arr) and (arr.min() < 0 or arr.max() >= num_classes):
        raise ConfigError(
            f"{name} labels must lie in 0..{num_classes - 1} (got {int(arr.min())}..{int(arr.max())})")
    return arr.astype(np.int64, copy=False)


class _Views:
    """Turns one list of training indices into (train, test, val) views under the config's rules."""

    def __init__(self, train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int,
                 cfg: PartitionConfig, carve_rng: np.random.Generator, test_rng: np.random.Generator):
        self.train_labels, self.cfg = train_labels, cfg
        self.carve_rng, self.test_rng = carve_rng, test_rng
        self.test_by_class = [np.flatnonzero(test_labels == c) for c in range(num_classes)]

    def __call__(self, idx: np.ndarray, exclude: np.ndarray | None = None,
                 own_test: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``exclude``: test-split indices not to sample (the client's earlier stages' test data);
        ``own_test``: the client's own test rows (``--local-test own``), used as they are."""
        cfg = self.cfg
        train = np.sort(idx).astype(np.int64)
        test = np.empty(0, dtype=np.int64) if own_test is None else own_test
        if cfg.local_test == "holdout":
            train, test = local_test.carve(train, self.train_labels, cfg.test_fraction, self.carve_rng)
        # Validation comes after the holdout so the test fraction refers to the client's whole share.
        train, val = local_test.carve(train, self.train_labels, cfg.val_fraction, self.carve_rng)
        if cfg.local_test == "sampled":
            test = local_test.sample_test(train, self.train_labels, self.test_by_class,
                                          cfg.test_fraction, self.test_rng, exclude)
        return train, test, val


def carve_server(labels: np.ndarray, num_classes: int, config: PartitionConfig,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labelled, unlabelled, rest): sorted int64 indices of the whole train split.

    labelled: ``server_samples_per_class`` samples of every class, drawn without replacement;
    unlabelled: ``server_unlabelled`` samples drawn uniformly from what is left (so their class
    mix follows the split's); rest: everything else, the pool the clients are cut from.
    """
    per_class, n_unlabelled = config.server_samples_per_class, config.server_unlabelled
    parts = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        if per_class and per_class >= len(idx):
            raise ConfigError(
                f"partition.server_samples_per_class {per_class} must be below the {len(idx)} training "
                f"samples of class {c} (the clients keep at least one); lower it")
        parts.append(rng.choice(idx, size=per_class, replace=False) if per_class else idx[:0])
    labelled = np.sort(np.concatenate(parts)).astype(np.int64)
    free = np.setdiff1d(np.arange(len(labels), dtype=np.int64), labelled)
    if n_unlabelled >= len(free):
        raise ConfigError(
            f"partition.server_unlabelled {n_unlabelled} must be below the {len(free)} training samples "
            "left after the server's labelled set (the clients keep some); lower it")
    unlabelled = np.sort(rng.choice(free, size=n_unlabelled, replace=False)).astype(np.int64)
    return labelled, unlabelled, np.setdiff1d(free, unlabelled)


def make_partition(train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int,
                   config: PartitionConfig, seed: int, train_clients: np.ndarray | None = None,
                   test_clients: np.ndarray | None = None) -> Partition:
    """Partition the training split into clients; deterministic in `seed`.

    ``train_clients`` / ``test_clients``: each row's client id, for data that come split by client
    (``--partition natural``; ``--local-test own`` takes each client's test rows of its own id).
    """
    config.check(num_classes)
    if config.scheme == "natural" and train_clients is None:
        raise ConfigError("--partition natural needs data with client ids (an npz: file with a 'client' "
                          "array, or a folder: of client folders)")
    if config.local_test == "own" and (config.scheme != "natural" or test_clients is None):
        raise ConfigError("--local-test own needs --partition natural and client ids in the test split")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0 (got {seed})")
    train_labels = _check_labels(train_labels, num_classes, "train")
    test_labels = _check_labels(test_labels, num_classes, "test")
    # Independent streams per step, so e.g. changing --val-fraction does not reshuffle the partition.
    seeds = np.random.SeedSequence(seed)
    lt_rng, part_rng, carve_rng, test_rng = (np.random.default_rng(s) for s in seeds.spawn(4))

    server, pool = None, None
    if config.has_server_data:  # a fifth stream: without server data nothing above changes
        labelled, unlabelled, pool = carve_server(
            train_labels, num_classes, config, np.random.default_rng(seeds.spawn(1)[0]))
        server = ServerData(labelled, unlabelled, train_split_labels=train_labels)
    kept = apply_longtail(train_labels, num_classes, config.imbalance, lt_rng, pool)
    global_counts = np.bincount(train_labels[kept], minlength=num_classes).astype(np.int64)
    test_source = "train" if config.local_test == "holdout" else "test"
    test_split_labels = train_labels if test_source == "train" else test_labels
    views = _Views(train_labels, test_labels, num_classes, config, carve_rng, test_rng)
    hint = _EMPTY_HINT[config.scheme]
    refs = {"train_split_labels": train_labels, "test_split_labels": test_split_labels}

    clients: list[ClientData] = []
    if config.scheme == "stages":
        for i, client_stages in enumerate(schemes.stages(train_labels, kept, num_classes, config, part_rng)):
            stage_data: list[StageData] = []
            for k, (classes, idx) in enumerate(client_stages):
                if len(idx) == 0:
                    raise ConfigError(
                        f"partition left client {i} stage {k} with no training samples; {hint}")
                drawn = np.sort(np.concatenate([s.test for s in stage_data])) if stage_data else None
                train, test, val = views(idx, drawn if test_source == "test" else None)
                stage_data.append(StageData(classes, train, test, val, **refs))
            clients.append(ClientData(
                train=np.sort(np.concatenate([s.train for s in stage_data])),
                test=np.sort(np.concatenate([s.test for s in stage_data])),
                val=np.sort(np.concatenate([s.val for s in stage_data])),
                stages=stage_data, **refs))
    else:
        if config.scheme == "natural":
            lists = schemes.natural(np.asarray(train_clients), kept, config.num_clients)
        else:
            scheme = "pathological" if config.scheme == "semantic" else config.scheme
            lists = _SCHEME_FUNCS[scheme](train_labels, kept, num_classes, config, part_rng)
        for i, idx in enumerate(lists):
            if len(idx) == 0:
                raise ConfigError(f"partition left client {i} with no training samples; {hint}")
            own = np.flatnonzero(np.asarray(test_clients) == i) if config.local_test == "own" else None
            train, test, val = views(idx, own_test=own)
            classes = schemes.semantic_classes(i, num_classes, config) if config.scheme == "semantic" else None
            clients.append(ClientData(train, test, val, classes=classes, **refs))
    return Partition(num_classes=num_classes, kept=kept, global_train_counts=global_counts,
                     clients=clients, test_source=test_source, scheme=config.scheme, server=server)
