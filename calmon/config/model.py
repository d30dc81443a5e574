"""The typed, frozen config: one dataclass per section, each field with its type,
its bounds (``Range``, durations, sizes) and its default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from calmon.config.units import DAY, DURATION, MIB, MINUTE, SIZE, TIB, YEAR, Duration, Range
from calmon.names import FitMethod


@dataclass(frozen=True)
class Instance:
    index: Annotated[int, Range(0)]
    count: Annotated[int, Range(1)]


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: tuple[str, ...] = ("localhost:9092",)
    group_id: str = "calmon"
    predictions_topic: str = "predictions"
    labels_topic: str = "labels"
    dead_letter_topic: str | None = None
    calibrators_topic: str | None = None
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    max_record_bytes: Annotated[int, Range(64, 64 * MIB)] = 1_048_576
    # {index, count} (static, §7) or v4 "group": partitions assigned by the consumer group (§8)
    instance: Instance | Literal["group"] | None = None
    # v4: each task's state, compacted; None = <group_id>-state-changelog in group mode (§8)
    state_changelog_topic: str | None = None
    client: Mapping[str, Any] = field(default_factory=dict)
    library: Literal["kafka-python", "confluent"] = "kafka-python"
    # a record ts further than this past its Kafka timestamp is bad_ts: one record from the
    # far future would otherwise move event-time "now" and expire everything after it
    max_clock_skew: Annotated[float, DURATION, Range(1.0, 7 * DAY)] = 3600.0
    # v3: joined samples keyed by model, for one owner per model's recalibration (§7)
    joined_topic: str | None = None

    @property
    def group(self) -> bool:
        """v4: partitions come from the consumer-group protocol (``instance: group``)."""
        return self.instance == "group"

    @property
    def static(self) -> Instance | None:
        """The fixed ``{index, count}`` share (§7); None with one instance or in group
        mode, where no instance owns a partition by its number."""
        return self.instance if isinstance(self.instance, Instance) else None

    @property
    def changelog_topic(self) -> str:
        """Where group mode keeps each task's state (§8)."""
        return self.state_changelog_topic or f"{self.group_id}-state-changelog"


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds on every map keyed by input, so no producer can grow memory without end."""

    max_models: Annotated[int, Range(1, 100_000)] = 100
    # a pending K-class score is found as row * 2**20 + K (engine/join.py): K < 2**20
    max_classes: Annotated[int, Range(2, 2**20 - 1)] = 1000
    max_id_bytes: Annotated[int, Range(1, 65_536)] = 256
    max_name_bytes: Annotated[int, Range(1, 4096)] = 128
    # v3: (model, segment) series per instance; past it a new segment folds into __other__
    max_series: Annotated[int, Range(1, 10_000_000)] = 5000
    # v3: the budget check-config compares the worst case with; None = the cgroup limit
    memory: Annotated[int, SIZE, Range(16 * MIB, 64 * TIB)] | None = None


@dataclass(frozen=True)
class LabelFields:
    """The labels topic's own paths where they differ; None falls back to ``fields.*``."""

    id: str | None = None
    model: str | None = None
    ts: str | None = None
    segment: str | None = None
    label: str | None = None


@dataclass(frozen=True)
class FieldsConfig:
    """Dotted paths to each field inside a record."""

    id: str = "id"
    model: str = "model"
    ts: str = "ts"
    segment: str = "segment"
    label: str = "label"
    prob: str = "prob"
    logit: str = "logit"
    probs: str = "probs"
    logits: str = "logits"
    labels: LabelFields | None = None  # v3
    decision: str | None = None  # v5: the model's own decision in a prediction, if any

    def for_labels(self) -> FieldsConfig:
        """The paths the labels topic is read with: ``labels.*`` where set, else ours."""
        if self.labels is None:
            return self
        own = {k: v for k, v in dataclasses.asdict(self.labels).items() if v is not None}
        return dataclasses.replace(self, **own, labels=None)


THRESHOLD = 0.5  # a binary decision without a decision field or a threshold: p >= 0.5


@dataclass(frozen=True)
class ModelConfig:
    """v5: one entry of ``models:``. The entry ``"*"`` holds for every model; a model's
    own entry overlays it key by key (a key left unset, None, falls back to ``"*"``)."""

    # the class names in score order (binary: [negative, positive]): labels and
    # decisions may give a name instead of an index
    classes: tuple[str, ...] | None = None
    # binary: the decision is p >= threshold when a prediction carries none
    threshold: Annotated[float, Range(0, 1, open_lo=True, open_hi=True)] | None = None

    def over(self, base: ModelConfig) -> ModelConfig:
        """This entry overlaid on ``base`` key by key."""
        return ModelConfig(self.classes if self.classes is not None else base.classes,
                           self.threshold if self.threshold is not None else base.threshold)


EVERY_MODEL = "*"


@dataclass(frozen=True)
class EstimatesConfig:
    """v5: label-free estimates read through a map fitted on the labelled samples."""

    calibration: Literal["labelled", "live"] = "labelled"
    # labelled samples a series' map needs; fewer: the fallbacks (model, last, live, raw)
    min_samples: Annotated[int, Range(1, 10**9)] = 1000
    # a map is fitted on the newest buckets of the largest window until they hold this many
    samples: Annotated[int, Range(1, 10**12)] = 50_000


@dataclass(frozen=True)
class MissingLabel:
    value: Annotated[int, Range(0, 2**20 - 2)]
    after: Duration


@dataclass(frozen=True)
class JoinConfig:
    ttl: Annotated[float, DURATION, Range(MINUTE, YEAR)] = 7 * 86400.0
    label_ttl: Duration = 3600.0
    max_pending: Annotated[int, Range(1, 100_000_000)] = 1_000_000
    missing_label: MissingLabel | None = None


# a window is a minute to a year: shorter ones hold a handful of samples and turn over
# between two scrapes; each is a ring of buckets, so a longer one costs memory for nothing
WINDOW_RANGE = Range(MINUTE, YEAR)


@dataclass(frozen=True)
class Window:
    """One sliding window: its name as configured (the ``window`` label) and length."""

    name: str
    seconds: float


@dataclass(frozen=True)
class ExportConfig:
    """v3: what /metrics carries (the series budget)."""

    windows: tuple[str, ...] | None = None  # None = every window of metrics.windows
    bins: Literal["all", "models", "none"] = "models"
    families: tuple[str, ...] | None = None  # None = every family for each model's __all__
    segment_families: tuple[str, ...] | None = (
        "ece", "ece_lower", "ece_upper", "window_samples", "calibrated_ece",
        "observed_over_expected")


@dataclass(frozen=True)
class MetricsConfig:
    bins: Annotated[int, Range(1, 1000)] = 15
    fine_bins: Annotated[int, Range(1, 100_000)] = 1000
    windows: tuple[Window, ...] = (
        Window("1h", 3600.0),
        Window("24h", 86400.0),
        Window("7d", 604800.0),
    )
    classwise: bool = False
    mce_min_samples: Annotated[int, Range(1, 10**9)] = 30  # sparser bins are left out of MCE
    interval_level: Annotated[float, Range(0, 1, open_lo=True, open_hi=True)] = 0.9
    # v3: how often the expensive statistics are recomputed
    refresh: Annotated[float, DURATION, Range(1.0, DAY)] = 30.0
    export: ExportConfig = field(default_factory=ExportConfig)  # v3


@dataclass(frozen=True)
class SegmentsConfig:
    slices: tuple[tuple[str, ...], ...] = (("country",), ("device",))
    max_values: Annotated[int, Range(1, 100_000)] = 50


@dataclass(frozen=True)
class Triggers:
    ece_above: Annotated[float, Range(0, 1)] | None = 0.05
    ece_increase: Annotated[float, Range(0, 1)] | None = 0.02
    observed_over_expected: tuple[float, float] | None = (0.9, 1.1)
    classwise_ece_above: Annotated[float, Range(0, 1)] | None = None  # v3


@dataclass(frozen=True)
class RecalibrationConfig:
    enabled: bool = True
    interval: Annotated[float, DURATION, Range(1.0, 7 * DAY)] = 300.0
    method: Literal[FitMethod, "auto"] = "temperature"
    per_segment: bool = False
    min_samples: Annotated[int, Range(1, 10_000_000)] = 2000
    buffer: Annotated[int, Range(10, 10_000_000)] = 50_000
    holdout_fraction: Annotated[float, Range(0, 1, open_lo=True, open_hi=True)] = 0.3
    cooldown: Duration = 3600.0
    retry_after: Duration = 6 * 3600.0  # v3: a rejected refit is retried at the latest after this
    alpha: Annotated[float, Range(0, 1, open_lo=True, open_hi=True)] = 0.01
    window: str = "24h"
    triggers: Triggers = field(default_factory=Triggers)
    output_dir: str = "./calibrators"


@dataclass(frozen=True)
class VerifyKey:
    id: str
    public_key: str  # base64 of the raw 32 bytes, or PEM


@dataclass(frozen=True)
class CalibratorsConfig:
    """v3: signing of published calibrator documents (Ed25519)."""

    signing_key: str | None = None  # base64 of the raw 32-byte private key, or PEM
    key_id: str | None = None
    verify_keys: tuple[VerifyKey, ...] = ()


@dataclass(frozen=True)
class AlertsConfig:
    webhook: str | None = None


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: Annotated[int, Range(0, 65535)] = 9108
    web_config_file: str | None = None  # v3: exporter-toolkit web config (TLS, basic auth)


@dataclass(frozen=True)
class StateConfig:
    dir: str = "./state"
    # sub-second for tests and demos; a checkpoint is skipped when nothing changed
    checkpoint_interval: Annotated[float, DURATION, Range(0.1, DAY)] = 10.0
    on_corrupt: Literal["fail", "reset"] = "fail"


@dataclass(frozen=True)
class LoggingConfig:
    """v3. CALMON_LOG_LEVEL overrides ``level``."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    fields: FieldsConfig = field(default_factory=FieldsConfig)
    models: Mapping[str, ModelConfig] = field(default_factory=dict)  # v5
    estimates: EstimatesConfig = field(default_factory=EstimatesConfig)  # v5
    join: JoinConfig = field(default_factory=JoinConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    segments: SegmentsConfig = field(default_factory=SegmentsConfig)
    recalibration: RecalibrationConfig = field(default_factory=RecalibrationConfig)
    calibrators: CalibratorsConfig = field(default_factory=CalibratorsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    state: StateConfig = field(default_factory=StateConfig)

    def model(self, name: str) -> ModelConfig:
        """The settings of model ``name``: its own entry over ``"*"``, the threshold
        defaulting to 0.5."""
        every = self.models.get(EVERY_MODEL, ModelConfig())
        own = self.models.get(name)
        out = own.over(every) if own is not None and name != EVERY_MODEL else every
        return out if out.threshold is not None else ModelConfig(out.classes, THRESHOLD)

    def window(self, name: str) -> Window:
        """The configured window called ``name``. Raises KeyError when there is none."""
        for w in self.metrics.windows:
            if w.name == name:
                return w
        raise KeyError(name)
