"""Typed, validated run configuration.

One :class:`RunConfig` describes a run completely; ``config.json`` in every run folder is its
fully resolved dump, and ``RunConfig.model_validate(json)`` rebuilds the run. Command-line flags,
``--config FILE.toml`` and ``--set key=value`` all end up here.
"""

from __future__ import annotations

import functools
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
from fedtail.settings import flag_keys, setting, settings


CHECKPOINT_EVERY = 25  # default rounds between checkpoints (see RunConfig.checkpoint_every)
# Default rounds between full clustering records: keeps a 1000-round FedAC run with 100 clients
# under 1 MB of metrics.jsonl (benchmarks/fedac/README.md, "Clustering records").
LOG_CLUSTERING_EVERY = 25
DEVICES = r"auto|cpu|cuda|cuda:\d+"  # what --device takes (fedtail.engine.device resolves it)


class TrainConfig(BaseModel):
    """Local training settings every algorithm reads (an algorithm may add its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    local_epochs: int = Field(1, ge=1, json_schema_extra=setting('local epochs per round', panel='Local training'))
    # a fixed number of SGD steps (batches) per round instead of epochs
    local_steps: int | None = Field(
        None, ge=1, json_schema_extra=setting('local SGD steps per round (instead of epochs)', panel='Local training')
    )
    batch_size: int = Field(64, ge=1, json_schema_extra=setting('batch size', panel='Local training'))
    lr: float = Field(0.01, gt=0, json_schema_extra=setting('learning rate', panel='Local training'))
    momentum: float = Field(0.0, ge=0, lt=1, json_schema_extra=setting("SGD momentum (default: the algorithm's reference)", panel='Local training'))
    weight_decay: float = Field(0.0, ge=0, json_schema_extra=setting('SGD weight decay', panel='Local training'))
    lr_decay: float = Field(1.0, gt=0, le=1, json_schema_extra=setting('lr multiplier per round', panel='Local training'))
    grad_clip: float | None = Field(None, gt=0, json_schema_extra=setting("max gradient norm (default: the algorithm's reference; --set train.grad_clip=null: none)", panel='Local training'))

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
        0.0, ge=0, le=1, json_schema_extra=setting('probability that a sampled client fails to reply in a round', panel='Faults')
    )
    min_replies: int = Field(
        1, ge=1, json_schema_extra=setting('an exchange with fewer accepted replies skips the round (server state unchanged; default 1)', panel='Faults')
    )
    max_update_norm: float | None = Field(
        None, gt=0, json_schema_extra=setting('reject replies whose tensors lie farther (L2) than this from those sent', panel='Faults')
    )
    # a NaN/inf loss or value in a reply stops the run as diverged (stop) or only rejects that
    # reply (reject: for deployments with faulty clients)
    on_nonfinite: Literal["stop", "reject"] = Field(
        "stop",
        json_schema_extra=setting('stop (default: the run ends as diverged, exit 3) | reject (only that reply is rejected)', panel='Faults')
    )
    # how the server halves average the clients' replies (fedtail.algorithms.aggregate: the rule,
    # every algorithm's WeightedMean takes it; Algorithm.robust says which methods can)
    aggregate: str = Field(
        "mean",
        json_schema_extra=setting('mean (default) | median | trimmed:F | krum:F | krum:F:M: how replies are averaged (coordinate-wise median, trimmed mean dropping F per side, Krum / multi-Krum of M assuming F faulty); fedtail list says which methods take it', panel='Faults', omit_default=True)
    )
    # clients that send corrupted updates, chosen by the seed (fedtail.engine.guard), for robustness
    # benchmarks
    byzantine: int = Field(
        0, ge=0, json_schema_extra=setting('number of hostile clients (chosen by the seed) that corrupt every update they send (--byzantine-mode)', panel='Faults', omit_default=True)
    )
    byzantine_mode: str = Field(
        "sign-flip",
        json_schema_extra=setting('sign-flip (default: the update reversed) | scale:S (the update times S) | gaussian:S (the update replaced by N(0, S^2) noise)', panel='Faults', omit_default=True)
    )

    @field_validator("aggregate")
    @classmethod
    def _aggregate(cls, v: str) -> str:
        from fedtail.algorithms.aggregate import Rule

        return str(Rule.parse(v))

    @field_validator("byzantine_mode")
    @classmethod
    def _byzantine_mode(cls, v: str) -> str:
        from fedtail.engine.guard import Corruption

        return str(Corruption.parse(v))


class PrivacyConfig(BaseModel):
    """Client-level differential privacy (DP-FedAvg; ``fedtail.engine.guard``): every client clips its
    update to L2 norm ``clip``, the server adds N(0, (noise · clip)²) to the sum of the updates; the
    privacy spent is accounted per round by Google's dp-accounting (``pip install fedtail[dp]``).
    The default (no clip) leaves a run as it was before these settings existed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip: float | None = Field(
        None, gt=0, json_schema_extra=setting('client-level DP: clip every client update to this L2 norm C (turns DP on; needs --dp-noise or --dp-epsilon)', flag='dp_clip', panel='Privacy')
    )
    noise: float | None = Field(
        None, ge=0, json_schema_extra=setting('client-level DP: noise multiplier z, Gaussian noise of std z*C on the sum of the clipped updates', flag='dp_noise', panel='Privacy')
    )
    epsilon: float | None = Field(
        None, gt=0, json_schema_extra=setting("client-level DP: the epsilon to spend over the run's rounds; z is chosen for it (instead of --dp-noise)", flag='dp_epsilon', panel='Privacy')
    )
    delta: float = Field(
        1e-5, gt=0, lt=1, json_schema_extra=setting('client-level DP: the delta of the reported (epsilon, delta) (default 1e-5)', flag='dp_delta', panel='Privacy')
    )

    @property
    def active(self) -> bool:
        return self.clip is not None

    @model_validator(mode="after")
    def _consistent(self) -> "PrivacyConfig":
        if self.clip is None:
            if self.noise is not None or self.epsilon is not None:
                raise ValueError("--dp-noise and --dp-epsilon need --dp-clip C (the clipping norm)")
        elif (self.noise is None) == (self.epsilon is None):
            raise ValueError("--dp-clip needs exactly one of --dp-noise z and --dp-epsilon E")
        return self


class FinetuneConfig(BaseModel):
    """Fine-tuning before personalised evaluation, one engine setting for every algorithm
    (FL-bench's ``finetune_epoch``): at each evaluation every client trains the model it is scored
    with on its own training data, then is scored. Nothing of it reaches the client's state or the
    server; its batches come from the evaluation task's own random stream, so results do not depend
    on how often one evaluates. The global model on the global test split is scored as it is.

    The default (no fine-tuning) leaves every run as it was before this setting existed; FedBABU and
    Per-FedAvg get theirs from their reference settings (``fedtail list``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(
        0, ge=0, json_schema_extra=setting("epochs of local SGD on the evaluated model before each personalised evaluation (0: none; default: the algorithm's reference)", flag="finetune_epochs", panel="Rounds and evaluation")
    )
    steps: int | None = Field(
        None, ge=1, json_schema_extra=setting("fine-tuning SGD steps (batches) instead of --finetune-epochs", flag="finetune_steps", panel="Rounds and evaluation")
    )
    params: Literal["all", "head"] = Field(
        "all", json_schema_extra=setting("all | head: what fine-tuning trains (head: the body frozen)", flag="finetune_params", panel="Rounds and evaluation")
    )
    lr: float | None = Field(
        None, gt=0, json_schema_extra=setting("fine-tuning learning rate (default: the run's lr at the evaluated round)", flag="finetune_lr", panel="Rounds and evaluation")
    )
    optimizer: Literal["run", "plain"] = Field(
        "run", json_schema_extra=setting("run (the local update's SGD: momentum, weight decay, clipping) | plain (plain gradient steps)", flag="finetune_optimizer", panel="Rounds and evaluation")
    )

    @model_validator(mode="after")
    def _one_length(self) -> "FinetuneConfig":
        if self.steps is not None and self.epochs:
            raise ValueError(
                f"--finetune-steps {self.steps} and --finetune-epochs {self.epochs}: set one of them"
            )
        return self

    @property
    def active(self) -> bool:
        return self.steps is not None or self.epochs > 0


class RunConfig(BaseModel):
    """Everything that defines one run; the seed makes it exactly reproducible."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str = Field("fedavg", json_schema_extra=setting('algorithm name (see `fedtail list`)', panel='Algorithm, data and model', short='-a'))
    dataset: str = Field("fmnist", json_schema_extra=setting('dataset name', panel='Algorithm, data and model', commands=('run', 'partition')))
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    data_dir: str | None = Field(None, json_schema_extra=setting('folder with the dataset files', panel='Algorithm, data and model', commands=('run', 'partition')))
    model: str = Field("cnn-fmnist", json_schema_extra=setting('model name', panel='Algorithm, data and model'))
    # where the model's head (classifier) starts: 'last' (the last linear layer) or 'all-fc'
    # (every fully connected layer after the feature extractor); null: the model's own split. Runs
    # built from flags or files get their algorithm's reference split unless they set it
    head: Literal["last", "all-fc"] | None = Field(
        None,
        json_schema_extra=setting("last | all-fc: where the model's head starts (default: the algorithm's reference split)", panel='Algorithm, data and model', omit_default=True)
    )
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    options: dict[str, Any] = Field(default_factory=dict, description="algorithm options (--set)")
    fraction: float = Field(0.2, json_schema_extra=setting('fraction of clients per round, in (0, 1]', panel='Rounds and evaluation'))
    rounds: int = Field(10, ge=1, json_schema_extra=setting('communication rounds', panel='Rounds and evaluation'))
    # rounds of each stage task with --partition stages (default rounds / stages; rounds must
    # equal rounds_per_stage × stages)
    rounds_per_stage: int | None = Field(
        None,
        ge=1,
        json_schema_extra=setting('stages, blocks schedule: rounds of each stage task (default rounds / stages; rounds = this × stages)', panel='Rounds and evaluation', omit_default=True)
    )
    # nested (default: every round of global optimisation runs the M stage tasks in turn, one
    # communication round each, as the GLDP paper's Algorithm 1) or blocks (M consecutive blocks
    # of rounds, one stage task each)
    stage_schedule: Literal["nested", "blocks"] | None = Field(
        None,
        json_schema_extra=setting('stages: nested (default: each round of global optimisation trains the stage tasks in turn, a round each) | blocks (consecutive blocks of rounds, one stage task each)', panel='Rounds and evaluation', omit_default=True)
    )
    seed: int = Field(0, ge=0, json_schema_extra=setting('random seed', panel='Reproducibility and compute', commands=('run', 'partition')))
    workers: int = Field(1, ge=1, json_schema_extra=setting('client-training processes (results do not depend on it)', panel='Reproducibility and compute', sweep_ignores=True))
    threads: int = Field(1, ge=1, json_schema_extra=setting('intra-op threads per client computation', panel='Reproducibility and compute'))
    # auto (the first CUDA device when torch sees one, else the CPU), cpu, cuda, cuda:N; results
    # do not depend on it beyond float rounding (fedtail.engine.device)
    device: str = Field(
        "auto",
        json_schema_extra=setting('auto (default: the first CUDA GPU torch sees, else the CPU) | cpu | cuda | cuda:N (results do not depend on it beyond float rounding)', panel='Reproducibility and compute', omit_default=True, sweep_ignores=True)
    )
    deterministic: bool = Field(
        True,
        description="deterministic CUDA kernels (same seed, same GPU model: same results); false trades "
        "that for speed; the CPU is deterministic either way", json_schema_extra=setting(omit_default=True, sweep_ignores=True)
    )
    channels_last: bool = Field(
        True, description="channels-last weights and images: faster CNN steps on CPU; changes float rounding"
    )
    eval_every: int = Field(1, ge=1, json_schema_extra=setting('evaluate every k rounds (and at the last)', panel='Rounds and evaluation'))
    # also evaluate every round (of global optimisation) among the final N, so the mean over the
    # final 10 rounds holds 10 evaluations whatever eval_every is (null: eval_every alone)
    eval_final: int | None = Field(
        None,
        ge=1,
        json_schema_extra=setting('also evaluate each of the final N rounds (e.g. 10 for last-10 means)', panel='Rounds and evaluation', omit_default=True)
    )
    eval_split: Literal["test", "val"] = Field("test", json_schema_extra=setting('test | val: which local split evaluations use', panel='Rounds and evaluation'))
    eval_global: bool = True
    targets: list[float] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9])
    edges: int = Field(1, ge=1, description="number of edge servers (hierarchical algorithms)")
    edge_assignment: Literal["contiguous", "round-robin", "random"] = "round-robin"
    faults: FaultConfig = Field(default_factory=FaultConfig, json_schema_extra=setting(omit_default=True))
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, json_schema_extra=setting(omit_default=True))
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig, json_schema_extra=setting(omit_default=True))
    # write the run's state to checkpoint.pt every N rounds (0: never), so a stopped run resumes
    # there; does not change results
    checkpoint_every: int = Field(
        CHECKPOINT_EVERY,
        ge=0,
        json_schema_extra=setting("write the run's state to OUT/checkpoint.pt every N rounds (0: never; default 25)", panel='Reproducibility and compute', omit_default=True, sweep_ignores=True)
    )
    # where the simulator keeps the clients' persistent state between rounds: memory, or disk (one
    # file per client in the run folder, loaded when the client is served; bounds memory with many
    # clients holding personal models); does not change results
    client_state: Literal["memory", "disk"] = Field(
        "memory",
        json_schema_extra=setting("memory (default) | disk: keep the clients' state between rounds in one file per client under OUT/.client-state (removed at the end) instead of in memory; results are the same", panel='Reproducibility and compute', omit_default=True, sweep_ignores=True)
    )
    # DIR] (repeatable): experiment tracking besides the run folder, each evaluation's metrics as
    # TensorBoard scalars (default DIR: OUT/tensorboard; fedtail.tracking); does not change
    # results
    log: list[str] = Field(
        default_factory=list,
        json_schema_extra=setting("tensorboard[:DIR] | mlflow[:URI] (repeatable): each evaluation's metrics as TensorBoard scalars (default DIR: OUT/tensorboard) or as an MLflow run (default: a SQLite store OUT/mlflow.db) too; needs pip install tensorboard / mlflow-skinny", panel='Logging', omit_default=True, sweep_ignores=True)
    )
    class_probabilities: bool = Field(
        False,
        json_schema_extra=setting("also log the global model's mean predicted probability of every class for the test images of each class, and its mean prediction entropy (MuPFL's Fig. 3(b))", panel='Logging', omit_default=True)
    )
    similarity_rounds: list[int] = Field(
        default_factory=list,
        json_schema_extra=setting("evaluated rounds (repeatable) that also log the clients' pairwise similarity: label-distribution KL, model L2 distance and LrCos of the evaluated models (FedAC's Fig. 2; fedtail.metrics.similarity)", panel='Logging', omit_default=True)
    )
    sample_masks: int = Field(
        0,
        ge=0,
        json_schema_extra=setting("segmentation: the final evaluation's predicted masks of the first K test images of every client, with the images and their true masks, in masks.npz of the run folder (MuPFL's Fig. 9; fedtail report draws them)", panel='Logging', omit_default=True, sweep_ignores=True)
    )
    log_clustering_every: int = Field(
        LOG_CLUSTERING_EVERY,
        ge=1,
        json_schema_extra=setting('clustered methods: the full clustering record (assignment, PCA view) in metrics.jsonl every N rounds and at the last (default 25); the other rounds log the number of clusters', panel='Logging', omit_default=True, sweep_ignores=True)
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
    def _migrate(cls, data: Any) -> Any:
        """A config stored by an older fedtail is read in today's form (fedtail.components.migrate)."""
        from fedtail.components import migrate

        return migrate(data)

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
        for rnd in self.similarity_rounds:
            if not (1 <= rnd <= self.rounds and self.plan.evaluates(rnd)):
                raise ValueError(
                    f"--similarity-rounds {rnd}: not an evaluated round of this run (rounds {self.rounds}, "
                    f"--eval-every {self.eval_every}); the matrices are of the evaluated models"
                )
        from fedtail.algorithms.aggregate import Rule

        rule, m = Rule.parse(self.faults.aggregate), self.clients_per_round
        if rule.min_inputs > m:
            raise ValueError(
                f"--aggregate {rule} needs at least {rule.min_inputs} replies a round; the run samples {m} clients"
            )
        if self.faults.byzantine > self.partition.num_clients:
            raise ValueError(f"--byzantine {self.faults.byzantine} exceeds the {self.partition.num_clients} clients")
        if self.privacy.active and rule.kind != "mean":
            raise ValueError(f"--dp-clip averages with noise: it takes --aggregate mean (got {rule})")
        # A reply rejected for what a client's data did changes n, which the accounting takes as public.
        if self.privacy.active and self.faults.on_nonfinite == "reject":
            raise ValueError("--dp-clip: --on-nonfinite reject drops a client for what its data did, which the privacy "
                             "accounting does not cover; use stop")
        bound, clip = self.faults.max_update_norm, self.privacy.clip
        if self.privacy.active and bound is not None and clip is not None and bound < clip * (1 + 1e-3):
            raise ValueError(f"--dp-clip {clip:g}: --max-update-norm {bound:g} would reject clipped updates (their norm "
                             f"is up to {clip:g}, and a little more in float32); give at least {clip * (1 + 1e-3):.6g}")
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
        # Settings declared omit_default are left out at their default, so config.json of runs made
        # before a setting existed (and the sweep folders holding them) stays as it was.
        for item in omitted(type(self)):
            *outer, name = item.path
            value, held = self, data
            for part in outer:  # a section's setting (faults.byzantine): left out of its section
                value, held = getattr(value, part), held.get(part)
                if not isinstance(held, dict):
                    break
            else:
                if getattr(value, name) == item.default:
                    held.pop(name, None)
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
    if len(loc) >= 2 and loc[0] == "privacy" and loc[1] in PrivacyConfig.model_fields:
        return "--dp-" + str(loc[1]).replace("_", "-")
    if len(loc) >= 2 and loc[0] == "finetune" and loc[1] in FinetuneConfig.model_fields:
        return "--finetune-" + str(loc[1]).replace("_", "-")
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
        if part not in ("partition", "train", "faults", "finetune", "privacy", "dataset_options", "options"):
            raise ConfigError(
                f"--set {key}: unknown section {part!r}; use algo.KEY, partition.KEY, train.KEY, faults.KEY, "
                "finetune.KEY, privacy.KEY or dataset_options.KEY"
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


@functools.cache
def omitted(model: type) -> list:
    """The settings config.json leaves out at their default (RunConfig._dump), deepest first (a
    section emptied by its own omitted settings is then left out when it is at its default)."""
    return sorted((s for s in settings(model) if s.omit_default), key=lambda s: -len(s.path))


# Flag name -> location in the raw config dict, from the fields' settings (fedtail.settings).
# Flags left unset do not override the file.
FLAG_KEYS: dict[str, tuple[str, ...]] = flag_keys(RunConfig)


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
