"""Names → the components a run is made of: algorithms, models and datasets.

A name is resolved in this order:

1. a built-in name (``fedavg``, ``cnn-fmnist``, ``fmnist``, ...);
2. a file-backed dataset spec: ``npz:FILE`` or ``folder:DIR`` (:mod:`fedtail.data.files`);
3. an import path ``package.module:NAME`` (the module must be importable: installed, or on
   ``PYTHONPATH``); NAME must be an :class:`~fedtail.algorithms.base.Algorithm`, a function
   returning a :class:`~fedtail.models.SplitModel` (called as ``NAME(input_shape, num_classes)``),
   or a dataset loader (called as ``NAME(**dataset_options)``, returning a
   :class:`~fedtail.data.base.Dataset`);
4. a name an installed package registers through the entry-point groups ``fedtail.algorithms``,
   ``fedtail.models`` and ``fedtail.datasets`` (the entry point's object is as in 3).

Resolution happens in every process that needs the component (the main one, each
``--workers`` process, each sweep run), always from the name in the run's config, so a
plug-in runs on every engine path. This module sits above the configuration: ``fedtail.config``
validates the shape of a config and knows no registry; :func:`check` is what ties a config's
names to real components.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from fedtail.errors import ConfigError

GROUPS = {"algorithm": "fedtail.algorithms", "model": "fedtail.models", "dataset": "fedtail.datasets"}
FILE_SCHEMES = ("npz:", "folder:")


def _builtins(kind: str) -> dict[str, Any]:
    if kind == "algorithm":
        from fedtail.algorithms import ALGORITHMS

        return ALGORITHMS
    if kind == "model":
        from fedtail.models.registry import MODELS

        return MODELS
    from fedtail.data.registry import DATASETS

    return DATASETS


@lru_cache(maxsize=None)
def _entry_points(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


def _import_path(kind: str, name: str) -> Any:
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--{kind} {name!r}: an import path is MODULE:NAME, e.g. mypackage.methods:MY_ALGO")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"--{kind} {name!r}: cannot import module {module_name!r} ({err})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"--{kind} {name!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _plugin(kind: str, name: str) -> Any | None:
    """The object behind an import path or an entry point, or None when ``name`` is neither."""
    if ":" in name:
        return _import_path(kind, name)
    ep = _entry_points(GROUPS[kind]).get(name)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as err:  # a broken plug-in package: say which
        raise ConfigError(f"--{kind} {name!r}: the entry point {ep.value!r} does not load ({err})") from None


def _unknown(kind: str, name: str) -> ConfigError:
    known = sorted(_builtins(kind)) + sorted(_entry_points(GROUPS[kind]))
    extra = " or npz:FILE, folder:DIR" if kind == "dataset" else ""
    return ConfigError(
        f"--{kind} {name!r} is unknown; choose one of: {', '.join(known)}{extra}, or give an import path MODULE:NAME"
    )


# --- the three kinds ---------------------------------------------------------------------------------


def algorithm(name: str):
    """The :class:`~fedtail.algorithms.base.Algorithm` called ``name``."""
    from fedtail.algorithms.base import Algorithm

    found = _builtins("algorithm").get(name)
    if found is None:
        found = _plugin("algorithm", name)
        if found is None:
            raise _unknown("algorithm", name)
        if not isinstance(found, Algorithm):
            raise ConfigError(f"--algorithm {name!r} is a {type(found).__name__}, not a fedtail Algorithm")
    return found


def model_builder(name: str) -> Callable[[tuple[int, ...], int], Any]:
    """The function that builds model ``name`` as ``builder(input_shape, num_classes)``."""
    from fedtail.models.registry import builder

    found = builder(name)
    if found is None:
        found = _plugin("model", name)
        if found is None:
            raise _unknown("model", name)
        if not callable(found):
            raise ConfigError(f"--model {name!r} is a {type(found).__name__}, not a function building a SplitModel")
    return found


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, head: str | None = None):
    """Model ``name`` for inputs shaped ``input_shape`` (no batch dim) and ``num_classes`` classes;
    ``head`` names the body/head split of a built-in model (None: the model's own)."""
    from fedtail.models.base import SplitModel
    from fedtail.models.registry import build_model as build_builtin, builder

    if builder(name) is not None:
        return build_builtin(name, tuple(input_shape), int(num_classes), head)
    if head is not None:
        raise ConfigError(f"--head {head}: model {name!r} is a plug-in, whose split is its own (leave --head out)")
    model = model_builder(name)(tuple(input_shape), int(num_classes))
    if not isinstance(model, SplitModel):
        raise ConfigError(f"--model {name!r} returned a {type(model).__name__}, not a fedtail SplitModel")
    return model


def load_dataset(name: str, data_dir: str | None = None, **options: Any):
    """Dataset ``name``: built-in, ``npz:FILE``, ``folder:DIR``, or a plug-in loader called with ``options``."""
    from fedtail.data.base import Dataset
    from fedtail.data.registry import check_name, load_dataset as load_builtin

    if name.startswith(FILE_SCHEMES):
        from fedtail.data.files import load_file_dataset

        return load_file_dataset(name, **options)
    try:
        check_name(name)
    except ConfigError:
        loader = _plugin("dataset", name)
        if loader is None:
            raise _unknown("dataset", name) from None
        if not callable(loader):
            raise ConfigError(f"--dataset {name!r} is a {type(loader).__name__}, not a loader function")
        try:
            data = loader(**options)
        except TypeError as err:
            raise ConfigError(f"--dataset {name!r}: bad dataset options ({err})") from None
        if not isinstance(data, Dataset):
            raise ConfigError(f"--dataset {name!r} returned a {type(data).__name__}, not a fedtail Dataset")
        return data
    return load_builtin(name, data_dir, **options)


def check(config) -> None:
    """Raise ConfigError unless the config's algorithm, model and dataset names resolve, and the
    algorithm's options validate, alone and against the run (e.g. no more clusters than clients)."""
    algorithm(config.algorithm)
    model_builder(config.model)
    if not config.dataset.startswith(FILE_SCHEMES):
        from fedtail.data.registry import check_name

        try:
            check_name(config.dataset)
        except ConfigError:
            if _plugin("dataset", config.dataset) is None:
                raise _unknown("dataset", config.dataset) from None
    algorithm_options(config).check_run(config.partition.num_clients)


def algorithm_options(config) -> Any:
    """The algorithm's own validated option object (from ``--set NAME.key=value``)."""
    from pydantic import ValidationError

    from fedtail.config import first_error

    spec = algorithm(config.algorithm)
    try:
        return spec.config(**config.options)
    except ValidationError as err:
        raise ConfigError(first_error(err, prefix=f"--set {config.algorithm}.", model=spec.config)) from None


def listing() -> dict[str, dict[str, str]]:
    """kind -> name -> one-line summary, built-ins first, then installed plug-ins' entry points."""
    out: dict[str, dict[str, str]] = {}
    for kind in ("algorithm", "dataset", "model"):
        names = {k: (v.summary if kind == "algorithm" else v) for k, v in _builtins(kind).items()}
        for ep_name, ep in _entry_points(GROUPS[kind]).items():
            names.setdefault(ep_name, f"plug-in {ep.value}")
        out[kind] = names
    return out


def apply_reference(raw: dict[str, Any]) -> None:
    """Fill what ``raw`` leaves unset with its algorithm's reference settings, in place.

    The algorithm's :class:`~fedtail.algorithms.base.Reference` (how its reference code runs it)
    gives the head split (``head``; not for a plug-in model, whose split is its own), ``train.momentum``,
    ``train.weight_decay``, ``train.grad_clip``, the fine-tuning before evaluation (``finetune``) and any algorithm
    options whose reference value differs from the option's default; every other option gets its
    default. Keys the run sets, even to the fedtail default, are kept. The filled values become
    explicit in the config (and so in ``config.json``), so a stored config means the same whatever
    references or defaults change later.
    """
    try:
        spec = algorithm(raw.get("algorithm", "fedavg"))
    except ConfigError:  # an unknown algorithm is reported by check()
        return
    ref = spec.reference
    if ref.head is not None and _builtin_model(raw.get("model")):
        raw.setdefault("head", ref.head)  # a plug-in model's split is its own: it cannot be moved
    train = raw.setdefault("train", {})
    if isinstance(train, dict):  # anything else is reported by the validation
        train.setdefault("momentum", ref.momentum)
        train.setdefault("weight_decay", ref.weight_decay)
        train.setdefault("grad_clip", ref.grad_clip)
    if ref.finetune:
        finetune = raw.setdefault("finetune", {})
        if isinstance(finetune, dict):
            for key, value in ref.finetune.items():
                finetune.setdefault(key, value)
    options = raw.setdefault("options", {})
    if isinstance(options, dict):
        for key, value in ref.options.items():
            options.setdefault(key, value)
        # every option explicit: a stored config.json keeps meaning what ran when a default changes
        raw["options"] = _complete(spec, options)


def _builtin_model(name: Any) -> bool:
    """Whether ``name`` (None: the default model) is a built-in model, whose head split can move."""
    from fedtail.config import RunConfig
    from fedtail.models.registry import builder

    if name is None:
        name = RunConfig.model_fields["model"].default
    return isinstance(name, str) and builder(name) is not None


def _complete(spec: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with every other option of ``spec`` as its validated config holds it (validators
    included: e.g. FL+HC's num_clusters is none when a distance threshold is set); unchanged when
    the options do not validate (the config check reports that)."""
    from pydantic import ValidationError

    try:
        full = spec.config(**options).model_dump(mode="json")
    except (ValidationError, TypeError):
        return options
    return {**full, **options}


def _stored_spec(config: Any) -> Any:
    """The algorithm of a ``config.json`` dict, or None (not a dict with dict options, or an
    algorithm that cannot be loaded)."""
    if not isinstance(config, dict) or not isinstance(config.get("options", {}), dict):
        return None
    try:
        return algorithm(str(config.get("algorithm", "fedavg")))
    except ConfigError:
        return None


def migrate(config: Any) -> Any:
    """A ``config.json`` dict stored by an older fedtail, in today's form: its algorithm's
    ``migrate`` (e.g. FedBABU's fine-tuning options, now the engine's ``finetune``); anything
    else (today's form, another algorithm, an unknown one) unchanged."""
    spec = _stored_spec(config)
    return config if spec is None or spec.migrate is None else spec.migrate(config)


def resolved_options(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a config.json dict) with its algorithm's options completed by the options'
    defaults; unchanged when the algorithm cannot be loaded.

    Runs stored before options were written out in full name only the options they set, and a
    run stored before an option existed does not name it; this makes them comparable with full
    configs. A missing option is completed with its default, not with a reference value: every
    reference value a run received is written into its config (:func:`apply_reference`), and a
    new option's default is the behaviour the code had before the option existed, so the default
    is what such a run ran with (docs/sweeps.md lists the defaults changed since, whose folders
    were given the values they ran with)."""
    config = migrate(config)
    spec = _stored_spec(config)
    return config if spec is None else config | {"options": _complete(spec, dict(config.get("options") or {}))}


def build_config(
    raw: dict[str, Any], sets: list[str] | tuple[str, ...] = (), rounds: bool = True, reference: bool = True
):
    """A validated :class:`~fedtail.config.RunConfig` whose components resolve: what every
    command runs before any work starts (``rounds=False``: no checks of the round schedule).

    ``reference`` fills what the run leaves unset with its algorithm's reference settings
    (:func:`apply_reference`); ``reference=False`` reads ``raw`` literally, as a stored
    ``config.json`` must be read (resuming, a sweep's run process).
    """
    import json

    from fedtail.config import apply_set, parse_config

    algorithm_name = raw.get("algorithm", "fedavg")
    for assignment in sets:  # options meant for another algorithm: say so, not "unknown section"
        head, _, rest = assignment.partition("=")[0].strip().partition(".")
        if rest and "." not in rest and head not in ("algo", algorithm_name) and head in _builtins("algorithm"):
            raise ConfigError(f"--set {assignment.partition('=')[0].strip()}: options of {head!r} do not apply "
                              f"to --algorithm {algorithm_name}")
    if reference:
        raw = json.loads(json.dumps(raw))
        for assignment in sets:
            apply_set(raw, assignment)
        sets = ()
        apply_reference(raw)
    config = parse_config(raw, sets, rounds)
    if reference and config.partition.scheme == "natural" and "num_clients" not in (raw.get("partition") or {}):
        # --partition natural without --clients: as many clients as the data has
        raw = json.loads(json.dumps(raw))
        raw.setdefault("partition", {})["num_clients"] = natural_clients(config)
        config = parse_config(raw, sets, rounds)
    check(config)
    return config


def natural_clients(config) -> int:
    """How many clients the data of a ``--partition natural`` run holds (its training rows' client ids)."""
    dataset = load_dataset(config.dataset, config.data_dir, **config.dataset_options)
    ids = dataset.train.clients
    if ids is None:
        raise ConfigError("--partition natural needs data with client ids (an npz: file with a 'client' "
                          "array, or a folder: of client folders)")
    return int(ids.max()) + 1 if len(ids) else 0
