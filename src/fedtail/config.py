"""Typed, validated run configuration.

One :class:`RunConfig` describes a run completely; ``config.json`` in every run folder is its
fully resolved dump, and ``RunConfig.model_validate(json)`` rebuilds the run. Command-line flags,
``--config FILE.toml`` and ``--set key=value`` all end up here.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from fedtail.errors import ConfigError, FedtailError
from fedtail.partition import PartitionConfig
from fedtail.schedule import RoundPlan


CHECKPOINT_EVERY = 25  # default rounds between checkpoints (see RunConfig.checkpoint_every)
# Default rounds between full clustering records: keeps a 1000-round FedAC run with 100 clients
# under 1 MB of metrics.jsonl (benchmarks/fedac/README.md, "Clustering records").
LOG_CLUSTERING_EVERY = 25
DEVICES = r"auto|cpu|cuda|cuda:\d+"  # what --device takes (fedtail.engine.device resolves it)


class TrainConfig(BaseModel):
    """Local training settings every algorithm reads (an algorithm may add its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    local_epochs: int = Field(1, ge=1, description="--local-epochs")
    local_steps: int | None = Field(
        None, ge=1, description="--local-steps: a fixed number of SGD steps (batches) per round instead of epochs"
    )
    batch_size: int = Field(64, ge=1, description="--batch-size")
    lr: float = Field(0.01, gt=0, description="--lr")
    momentum: float = Field(0.0, ge=0, lt=1, description="--momentum")
    weight_decay: float = Field(0.0, ge=0, description="--weight-decay")
    lr_decay: float = Field(1.0, gt=0, le=1, description="--lr-decay: lr multiplier applied per round")
    grad_clip: float | None = Field(None, gt=0, description="--grad-clip: max gradient norm")

    def lr_at(self, rnd: int) -> float:
        """Learning rate of round ``rnd`` (1-based)."""
        return self.lr * self.lr_decay ** (rnd - 1)


class FaultConfig(BaseModel):
    """Client failures and what the engine accepts as a reply (``engine/replies.py``).

    Every default leaves a run as it was before these settings existed: no dropouts, a round
    goes on with at least one accepted reply, no bound on update norms, a non-finite value
    anywhere stops the run as diverged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dropout: float = Field(
        0.0, ge=0, le=1, description="--dropout: probability that a sampled client fails to reply in a round (seeded)"
    )
    min_replies: int = Field(
        1, ge=1, description="--min-replies: fewer accepted replies in an exchange skip the round (server state unchanged)"
    )
    max_update_norm: float | None = Field(
        None, gt=0, description="--max-update-norm: reject a reply whose tensors lie farther (L2) from those sent"
    )
    on_nonfinite: Literal["stop", "reject"] = Field(
        "stop",
        description="--on-nonfinite: a NaN/inf loss or value in a reply stops the run as diverged (stop) "
        "or only rejects that reply (reject: for deployments with faulty clients)",
    )


class RunConfig(BaseModel):
    """Everything that defines one run; the seed makes it exactly reproducible."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str = "fedavg"
    dataset: str = "fmnist"
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    data_dir: str | None = None
    model: str = "cnn-fmnist"
    head: Literal["last", "all-fc"] | None = Field(
        None,
        description="--head: where the model's head (classifier) starts: 'last' (the last linear layer) or "
        "'all-fc' (every fully connected layer after the feature extractor); null: the model's own split. "
        "Runs built from flags or files get their algorithm's reference split unless they set it",
    )
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    options: dict[str, Any] = Field(default_factory=dict, description="algorithm options (--set)")
    fraction: float = Field(0.2, description="--fraction of clients sampled per round")
    rounds: int = Field(10, ge=1)
    rounds_per_stage: int | None = Field(
        None,
        ge=1,
        description="--rounds-per-stage: rounds of each stage task with --partition stages "
        "(default rounds / stages; rounds must equal rounds_per_stage × stages)",
    )
    stage_schedule: Literal["nested", "blocks"] | None = Field(
        None,
        description="--stage-schedule with --partition stages: nested (default: every round of global "
        "optimisation runs the M stage tasks in turn, one communication round each, as the GLDP paper's "
        "Algorithm 1) or blocks (M consecutive blocks of rounds, one stage task each)",
    )
    seed: int = Field(0, ge=0)
    workers: int = Field(1, ge=1, description="--workers: client-training processes")
    threads: int = Field(1, ge=1, description="--threads: intra-op threads per client computation")
    device: str = Field(
        "auto",
        description="--device: auto (the first CUDA device when torch sees one, else the CPU), cpu, cuda, "
        "cuda:N; results do not depend on it beyond float rounding (fedtail.engine.device)",
    )
    deterministic: bool = Field(
        True,
        description="deterministic CUDA kernels (same seed, same GPU model: same results); false trades "
        "that for speed; the CPU is deterministic either way",
    )
    channels_last: bool = Field(
        True, description="channels-last weights and images: faster CNN steps on CPU; changes float rounding"
    )
    eval_every: int = Field(1, ge=1)
    eval_final: int | None = Field(
        None,
        ge=1,
        description="also evaluate every round (of global optimisation) among the final N, so the mean over "
        "the final 10 rounds holds 10 evaluations whatever eval_every is (null: eval_every alone)",
    )
    eval_split: Literal["test", "val"] = "test"
    eval_global: bool = True
    targets: list[float] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9])
    edges: int = Field(1, ge=1, description="number of edge servers (hierarchical algorithms)")
    edge_assignment: Literal["contiguous", "round-robin", "random"] = "round-robin"
    faults: FaultConfig = Field(default_factory=FaultConfig)
    checkpoint_every: int = Field(
        CHECKPOINT_EVERY,
        ge=0,
        description="--checkpoint-every: write the run's state to checkpoint.pt every N rounds (0: never), "
        "so a stopped run resumes there; does not change results",
    )
    client_state: Literal["memory", "disk"] = Field(
        "memory",
        description="--client-state: where the simulator keeps the clients' persistent state between rounds: "
        "memory, or disk (one file per client in the run folder, loaded when the client is served; bounds "
        "memory with many clients holding personal models); does not change results",
    )
    log: list[str] = Field(
        default_factory=list,
        description="--log tensorboard[:DIR] (repeatable): experiment tracking besides the run folder, "
        "each evaluation's metrics as TensorBoard scalars (default DIR: OUT/tensorboard; fedtail.tracking); "
        "does not change results",
    )
    log_clustering_every: int = Field(
        LOG_CLUSTERING_EVERY,
        ge=1,
        description="--log-clustering-every: the clustered methods' full clustering record (assignment and "
        "PCA view) every N rounds and at the last, only the number of clusters in between; does not change results",
    )

    @field_validator("log")
    @classmethod
    def _log_kinds(cls, v: list[str]) -> list[str]:
        from fedtail.tracking import parse_log

        for spec in v:
            parse_log(spec)  # raises ValueError on an unknown kind
        return v

    @model_validator(mode="before")
    @classmethod
    def _canonical_head(cls, data: Any) -> Any:
        """A head split equal to the model's own is stored as null, so a run names a split only
        when it moves the boundary (config.json of runs on the model's own split stays as it was)."""
        from fedtail.models import HEADS, head_layers

        if isinstance(data, dict) and data.get("head") is not None:
            model = data.get("model", cls.model_fields["model"].default)
            head = data["head"]
            if model in HEADS and head in HEADS[model] and head_layers(model, head) == head_layers(model, None):
                data = {**data, "head": None}
        return data

    @field_validator("fraction")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"--fraction must be in (0, 1] (got {v})")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        spec = str(v).strip().lower()
        if not re.fullmatch(DEVICES, spec):
            raise ValueError(f"--device must be auto, cpu, cuda or cuda:N (got {v!r})")
        return spec

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[float]) -> list[float]:
        if any(not 0 < t <= 1 for t in v):
            raise ValueError(f"targets must be accuracies in (0, 1] (got {v})")
        return sorted(v)

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        # names (algorithm, dataset, model) are resolved by fedtail.components.check, not here
        if self.eval_split == "val" and self.partition.val_fraction <= 0:
            raise ValueError("eval_split 'val' needs --val-fraction > 0")
        if self.faults.min_replies > self.clients_per_round:
            raise ValueError(
                f"--min-replies {self.faults.min_replies} exceeds the {self.clients_per_round} clients sampled "
                "per round: every round would be skipped"
            )
        return self

    @model_validator(mode="after")
    def _stage_schedule(self, info: ValidationInfo) -> "RunConfig":
        m, rps = self.partition.stages, self.rounds_per_stage
        if info.context and not info.context.get("rounds", True):
            return self  # `fedtail partition` cuts the data and runs no rounds
        if self.partition.scheme != "stages":
            for flag, value in (("--rounds-per-stage", rps), ("--stage-schedule", self.stage_schedule)):
                if value is not None:
                    raise ValueError(
                        f"{flag} only applies to --partition stages (got --partition {self.partition.scheme})"
                    )
            return self
        if self.plan.schedule == "nested":
            if rps is not None:
                raise ValueError(
                    "--rounds-per-stage only applies to --stage-schedule blocks: with nested stages every "
                    "round of global optimisation is --stages rounds, one per stage task"
                )
            if self.rounds % m:
                raise ValueError(
                    f"--rounds {self.rounds} must be a multiple of --stages {m}: with --stage-schedule nested "
                    "each round of global optimisation runs the stage tasks in turn, one round each; "
                    "change --rounds or --stages"
                )
            return self
        if rps is None and self.rounds % m:
            raise ValueError(
                f"--rounds {self.rounds} must be a multiple of --stages {m}: each stage task gets "
                f"rounds / stages rounds; change --rounds or --stages"
            )
        if rps is not None and rps * m != self.rounds:
            raise ValueError(
                f"--rounds-per-stage {rps} × --stages {m} = {rps * m} must equal --rounds {self.rounds}; "
                f"set --rounds {rps * m} or leave --rounds-per-stage out"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        # Left out when unset, so config.json of runs without stages (and the sweep folders
        # holding them) stays as it was before the option existed.
        if self.rounds_per_stage is None:
            data.pop("rounds_per_stage", None)
        if self.stage_schedule is None:  # likewise
            data.pop("stage_schedule", None)
        if self.checkpoint_every == CHECKPOINT_EVERY:  # likewise: the default leaves config.json as it was
            data.pop("checkpoint_every", None)
        if self.faults == FaultConfig():  # likewise
            data.pop("faults", None)
        if self.log_clustering_every == LOG_CLUSTERING_EVERY:  # likewise
            data.pop("log_clustering_every", None)
        if self.client_state == "memory":  # likewise
            data.pop("client_state", None)
        if not self.log:  # likewise
            data.pop("log", None)
        if self.head is None:  # likewise: the model's own split, what every run used before
            data.pop("head", None)
        if self.eval_final is None:  # likewise
            data.pop("eval_final", None)
        if self.device == "auto":  # likewise
            data.pop("device", None)
        if self.deterministic:  # likewise
            data.pop("deterministic", None)
        return data

    @property
    def plan(self) -> RoundPlan:
        """The run's plan of rounds: which stage task each round trains, which rounds are
        evaluated, rounds of global optimisation (:mod:`fedtail.schedule`)."""
        return RoundPlan(
            rounds=self.rounds,
            stages=self.partition.stages if self.partition.scheme == "stages" else None,
            mode=self.stage_schedule,
            rounds_per_stage=self.rounds_per_stage,
            eval_every=self.eval_every,
            eval_final=self.eval_final or 0,
        )

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction * self.partition.num_clients))


# ---------------------------------------------------------------------------------------------
# Building a config from files, flags and --set overrides


def _flag_for(loc: tuple) -> str:
    """The command-line spelling of a config location, e.g. ('partition', 'alpha') -> --alpha."""
    from fedtail.partition import FLAGS

    if len(loc) >= 2 and loc[0] == "partition" and loc[1] in FLAGS:
        return FLAGS[loc[1]]
    if len(loc) >= 2 and loc[0] in ("train", "faults") and loc[1] in (TrainConfig.model_fields | FaultConfig.model_fields):
        return "--" + str(loc[1]).replace("_", "-")
    if len(loc) == 1 and loc[0] in RunConfig.model_fields:
        return "--" + str(loc[0]).replace("_", "-")
    return ".".join(str(p) for p in loc)


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at ``loc`` (for 'unknown key' messages)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = getattr(field, "annotation", None) if field else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return []
        model = sub
    return sorted(model.model_fields)


def first_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    e = err.errors()[0]
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        allowed = _allowed_keys(model or RunConfig, tuple(e["loc"]))
        msg = "unknown key; allowed: " + (", ".join(allowed) if allowed else "none (this takes no options)")
    if msg.startswith("--") or not e["loc"]:
        return msg
    where = prefix + ".".join(str(p) for p in e["loc"]) if prefix else _flag_for(tuple(e["loc"]))
    got = e.get("input")
    shown = "" if isinstance(got, dict) or got is None or e["type"] == "extra_forbidden" else f" (got {got!r})"
    return f"{where}: {msg}{shown}"


def parse_value(text: str) -> Any:
    """``--set`` values: JSON literals (numbers, true/false, null, lists), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_set(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set key=value`` to a raw config dict.

    ``algo.key`` or ``<algorithm>.key`` sets an algorithm option; ``partition.key``,
    ``train.key`` and ``dataset_options.key`` set nested fields; a bare key sets a top-level field.
    """
    key, sep, value = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set expects KEY=VALUE such as fedprox.mu=0.01 (got {assignment!r})")
    parts = key.split(".")
    head = parts[0]
    algorithm = raw.get("algorithm", "fedavg")
    if head in ("algo", algorithm) and len(parts) == 2:
        raw.setdefault("options", {})[parts[1]] = parse_value(value)
        return
    target = raw
    for part in parts[:-1]:
        if part not in ("partition", "train", "faults", "dataset_options", "options"):
            raise ConfigError(
                f"--set {key}: unknown section {part!r}; use algo.KEY, partition.KEY, train.KEY, faults.KEY "
                "or dataset_options.KEY"
            )
        target = target.setdefault(part, {})
    target[parts[-1]] = parse_value(value)


def load_toml(path: Path, what: str = "--config") -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a ConfigError that starts with ``what``."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what}: no such file {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{what} {path}: not valid TOML ({err})") from None


# Flag name -> location in the raw config dict. Flags left unset do not override the file.
FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "algorithm": ("algorithm",),
    "dataset": ("dataset",),
    "data_dir": ("data_dir",),
    "model": ("model",),
    "head": ("head",),
    "partition": ("partition", "scheme"),
    "imbalance": ("partition", "imbalance"),
    "alpha": ("partition", "alpha"),
    "clients": ("partition", "num_clients"),
    "min_samples": ("partition", "min_samples"),
    "balanced": ("partition", "balanced"),
    "classes_per_client": ("partition", "classes_per_client"),
    "iid_fraction": ("partition", "iid_fraction"),
    "samples_per_client": ("partition", "samples_per_client"),
    "groups": ("partition", "groups"),
    "quantity": ("partition", "quantity"),
    "classes_per_stage": ("partition", "classes_per_stage"),
    "stages": ("partition", "stages"),
    "test_fraction": ("partition", "test_fraction"),
    "local_test": ("partition", "local_test"),
    "val_fraction": ("partition", "val_fraction"),
    "fraction": ("fraction",),
    "rounds": ("rounds",),
    "rounds_per_stage": ("rounds_per_stage",),
    "stage_schedule": ("stage_schedule",),
    "local_epochs": ("train", "local_epochs"),
    "local_steps": ("train", "local_steps"),
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "momentum": ("train", "momentum"),
    "weight_decay": ("train", "weight_decay"),
    "lr_decay": ("train", "lr_decay"),
    "grad_clip": ("train", "grad_clip"),
    "seed": ("seed",),
    "workers": ("workers",),
    "threads": ("threads",),
    "device": ("device",),
    "eval_every": ("eval_every",),
    "eval_final": ("eval_final",),
    "eval_split": ("eval_split",),
    "checkpoint_every": ("checkpoint_every",),
    "dropout": ("faults", "dropout"),
    "min_replies": ("faults", "min_replies"),
    "max_update_norm": ("faults", "max_update_norm"),
    "on_nonfinite": ("faults", "on_nonfinite"),
    "log_clustering_every": ("log_clustering_every",),
    "client_state": ("client_state",),
    "log": ("log",),
}


def _parse_quantity(text: str) -> list[int]:
    try:
        low, high = (int(p) for p in text.split(":"))
    except ValueError:
        raise FedtailError(f"--quantity expects MIN:MAX such as 50:350 (got {text!r})") from None
    if not 1 <= low <= high:
        raise FedtailError(f"--quantity needs 1 <= MIN <= MAX (got {text!r})")
    return [low, high]


def flags_to_nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Map flag-named keys (``alpha``, ``local-epochs``, ``partition = "iid"``) to config paths.

    Config files may use either the nested config keys (``[partition] alpha = 0.5``) or the
    command-line flag names at top level; both end up in the same place.
    """
    override: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in flat.items():
        name = key.replace("-", "_")
        if name not in FLAG_KEYS or isinstance(value, dict):
            rest[key] = value
            continue
        if name == "quantity" and isinstance(value, str):
            value = _parse_quantity(value)
        target = override
        *parents, leaf = FLAG_KEYS[name]
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return merge(rest, override)


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins, nested sections merge key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_config(raw: dict[str, Any], sets: list[str] = (), rounds: bool = True) -> RunConfig:
    """Validate the shape of a raw (file + flags) dict after applying ``--set`` overrides.

    ``rounds=False`` skips the checks of the round schedule (for commands that run no rounds).
    Names are not resolved here, nor are an algorithm's reference settings filled in:
    :func:`fedtail.components.build_config` does all three.
    """
    raw = json.loads(json.dumps(raw))  # deep copy; also rejects non-JSON values early
    for assignment in sets:
        apply_set(raw, assignment)
    try:
        config = RunConfig.model_validate(raw, context={"rounds": rounds})
    except ValidationError as err:
        raise ConfigError(first_error(err)) from None
    return config
