"""Partition configuration: one pydantic model, validated with messages that name the CLI flag."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from fedtail.errors import ConfigError
from fedtail.settings import setting, settings

SchemeName = Literal["iid", "dirichlet", "pathological", "dominant", "stages", "natural", "semantic"]



class PartitionConfig(BaseModel):
    """How the training split is cut into clients and how local test/validation data are formed."""

    model_config = ConfigDict(extra="forbid")

    scheme: SchemeName = Field("dirichlet", json_schema_extra=setting('iid | dirichlet | pathological | dominant | stages | natural | semantic', flag='partition', panel='Partition', commands=('run', 'partition')))
    num_clients: int = Field(20, json_schema_extra=setting('number of clients (--partition natural: as many as the data holds)', flag='clients', panel='Partition', commands=('run', 'partition')))
    imbalance: float = Field(1.0, json_schema_extra=setting('long-tail imbalance factor IF >= 1', panel='Partition', commands=('run', 'partition')))
    alpha: float = Field(0.5, json_schema_extra=setting('Dirichlet concentration > 0', panel='Partition', commands=('run', 'partition')))
    min_samples: int = Field(10, json_schema_extra=setting('Dirichlet: minimum samples per client', panel='Partition', commands=('run', 'partition')))
    balanced: bool = Field(False, json_schema_extra=setting('Dirichlet: CReFF equal-size re-cut', panel='Partition', commands=('run', 'partition')))
    classes_per_client: int = Field(2, json_schema_extra=setting('pathological: classes per client; semantic: the classes each client keeps (MuPFL\'s β)', panel='Partition', commands=('run', 'partition')))
    iid_fraction: float = Field(0.2, json_schema_extra=setting('dominant: IID fraction s', panel='Partition', commands=('run', 'partition')))
    samples_per_client: int = Field(600, json_schema_extra=setting('dominant: training samples per client', panel='Partition', commands=('run', 'partition')))
    groups: int = Field(5, json_schema_extra=setting('dominant: number of label groups', panel='Partition', commands=('run', 'partition')))
    quantity: tuple[int, int] | None = Field(None, json_schema_extra=setting('per-client sample counts MIN:MAX', panel='Partition', commands=('run', 'partition')))
    classes_per_stage: int = Field(2, json_schema_extra=setting('stages: classes per stage task', panel='Partition', commands=('run', 'partition')))
    stages: int = Field(5, json_schema_extra=setting('stages: stage tasks per client', panel='Partition', commands=('run', 'partition')))
    test_fraction: float = Field(0.25, json_schema_extra=setting('local test size / training size', panel='Partition', commands=('run', 'partition')))
    local_test: Literal["sampled", "holdout", "own"] = Field("sampled", json_schema_extra=setting("sampled (from the official test split) | holdout | own (natural partitions: the client's own test rows)", panel='Partition', commands=('run', 'partition')))
    val_fraction: float = Field(0.0, json_schema_extra=setting('per-client validation fraction', panel='Partition', commands=('run', 'partition')))
    # Server-held data (FEDIC): carved from the training split before the long-tail cut, so no
    # client ever holds these samples. 0 = none (the partition is then exactly as without them).
    server_samples_per_class: int = 0
    server_unlabelled: int = 0

    @field_validator("num_clients", "classes_per_client", "samples_per_client", "groups",
                     "classes_per_stage", "stages")
    @classmethod
    def _at_least_one(cls, v: int, info) -> int:  # noqa: ANN001 - pydantic's ValidationInfo
        if v < 1:
            raise ValueError(f"{FLAGS[info.field_name]} must be >= 1 (got {v})")
        return v

    @field_validator("min_samples")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"--min-samples must be >= 0 (got {v})")
        return v

    @field_validator("server_samples_per_class", "server_unlabelled")
    @classmethod
    def _server_sizes(cls, v: int, info) -> int:  # noqa: ANN001 - pydantic's ValidationInfo
        if v < 0:
            raise ValueError(f"partition.{info.field_name} must be >= 0 (got {v})")
        return v

    @field_validator("imbalance")
    @classmethod
    def _imbalance(cls, v: float) -> float:
        if not v >= 1.0:  # also rejects NaN
            raise ValueError(f"--imbalance must be >= 1 (got {v})")
        return v

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if not v > 0.0:
            raise ValueError(f"--alpha must be > 0 (got {v})")
        return v

    @field_validator("iid_fraction")
    @classmethod
    def _iid_fraction(cls, v: float) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"--iid-fraction must be in [0, 1] (got {v})")
        return v

    @field_validator("test_fraction")
    @classmethod
    def _test_fraction(cls, v: float) -> float:
        if not v > 0.0:
            raise ValueError(f"--test-fraction must be > 0 (got {v})")
        return v

    @field_validator("val_fraction")
    @classmethod
    def _val_fraction(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError(f"--val-fraction must be in [0, 1) (got {v})")
        return v

    @field_validator("quantity")
    @classmethod
    def _quantity(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None:
            lo, hi = v
            if lo < 1 or hi < lo:
                raise ValueError(f"--quantity MIN MAX needs 1 <= MIN <= MAX (got {lo} {hi})")
        return v

    @model_validator(mode="after")
    def _combinations(self) -> PartitionConfig:
        if self.quantity is not None and self.scheme not in ("dirichlet", "pathological"):
            raise ValueError(
                f"--quantity only applies to --partition dirichlet or pathological (got {self.scheme})")
        if self.balanced and self.scheme not in ("dirichlet", "stages"):
            raise ValueError(f"--balanced only applies to --partition dirichlet or stages (got {self.scheme})")
        if self.balanced and self.quantity is not None:
            raise ValueError("--balanced cannot be combined with --quantity (both set client sizes)")
        if self.local_test == "holdout" and self.test_fraction >= 1.0:
            raise ValueError(
                f"--test-fraction must be < 1 with --local-test holdout (got {self.test_fraction})")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        # Left out when 0, so config.json of runs without server data (and the sweep folders
        # holding them) stays as it was before the options existed.
        for key in ("server_samples_per_class", "server_unlabelled"):
            if not data.get(key):
                data.pop(key, None)
        return data

    @property
    def has_server_data(self) -> bool:
        return self.server_samples_per_class > 0 or self.server_unlabelled > 0

    def check(self, num_classes: int) -> None:
        """Raise ConfigError for constraints that depend on the number of classes C."""
        c = num_classes
        if c < 1:
            raise ConfigError(f"the dataset must have at least 1 class (got {c})")
        if self.scheme in ("pathological", "semantic") and not 1 <= self.classes_per_client <= c:
            raise ConfigError(
                f"--classes-per-client must be in 1..{c} (got {self.classes_per_client})")
        if self.scheme == "dominant" and not 1 <= self.groups <= c:
            raise ConfigError(f"--groups must be in 1..{c} (got {self.groups})")
        if self.scheme == "stages" and not 1 <= self.classes_per_stage <= c:
            raise ConfigError(
                f"--classes-per-stage must be in 1..{c}, since the classes of one stage task are distinct "
                f"(got {self.classes_per_stage})")


# Field -> command-line flag, so every message (and the CLI) uses the same spelling: from the fields.
FLAGS: dict[str, str] = {s.path[-1]: s.flag for s in settings(PartitionConfig) if s.flag is not None}
