"""config.yaml -> a frozen, typed Config, validated once at start.

Every problem is reported, not just the first, as ``path.to.key: what is wrong``
(unknown keys included, so typos are caught). ``${VAR}`` and ``${VAR:-default}``
are expanded from the environment after parsing, always to a string (as
Kubernetes and Compose do), so one file serves every replica of a StatefulSet
and ``KAFKA_PASSWORD=007`` stays ``"007"``; a key that needs a number converts
the string and checks it as one. Every duration and size has bounds (the
``Range`` of its field), so a 1 ns window or a 10^8-sample buffer is an error,
not a surprise. The YAML may use anchors and aliases, but the document they
expand to is bounded (``MAX_YAML_NODES``), so an alias bomb is refused at once.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml

from calmon.errors import ConfigError

# ---------------------------------------------------------------- value kinds


def _bound(x: float) -> str:
    """A bound as written: 1048575, not 1.04858e+06."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Annotated marker: numeric bounds (inclusive unless ``open_*``)."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    def check(self, v: float, spell: Any = None) -> str | None:
        """What is wrong with ``v``, bounds written by ``spell`` (default: numbers)."""
        spell = spell or _bound
        if self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo):
            return f"must be {'>' if self.open_lo else '>='} {spell(self.lo)}"
        if self.hi is not None and (v >= self.hi if self.open_hi else v > self.hi):
            return f"must be {'<' if self.open_hi else '<='} {spell(self.hi)}"
        return None


class _DurationMarker:
    """Annotated marker: a duration string (``500ms``, ``30s``, ``15m``, ``24h``, ``7d``)."""


DURATION = _DurationMarker()
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
YEAR = 365 * DAY
# seconds, with the bounds every duration key has unless it says otherwise: at least
# 1 s (1 s intervals and cooldowns are valid), at most a year
Duration = Annotated[float, DURATION, Range(1.0, YEAR)]
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(text: str) -> float:
    """``'15m'`` -> 900.0. Raises ValueError when the text is not a positive duration."""
    m = _DURATION_RE.match(text)
    if not m:
        raise ValueError(f"expected a duration like 500ms, 30s, 15m, 24h or 7d, got {text!r}")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"must be a positive duration, got {text!r}")
    return seconds


class _SizeMarker:
    """Annotated marker: a size in bytes (``1048576``, ``512MiB``, ``2GiB``, ``1GB``)."""


SIZE = _SizeMarker()
Size = Annotated[int, SIZE]  # bytes, > 0
MIB, GIB, TIB = 2**20, 2**30, 2**40
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10,
               "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """``'2GiB'`` -> 2147483648. Raises ValueError when the text is not a positive size."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"must be a positive size, got {text!r}")
        return text
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"expected a size like 512MiB, 2GiB or a number of bytes, got {text!r}")
    n = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if n <= 0:
        raise ValueError(f"must be a positive size, got {text!r}")
    return n


def format_size(n: float) -> str:
    """Bytes as written in a bound: 16777216 -> '16MiB', 1000 -> '1000'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and float(n / size).is_integer():
            return f"{int(n // size)}{unit}"
    return _bound(n)


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 86400 -> '1d', 5400 -> '90m', 0.5 -> '500ms'."""
    for unit in ("d", "h", "m", "s"):
        n = seconds / _UNITS[unit]
        if n >= 1 and float(n).is_integer():
            return f"{int(n)}{unit}"
    return f"{seconds * 1000:g}ms"


# ---------------------------------------------------------------- the model


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
    instance: Instance | None = None
    client: Mapping[str, Any] = field(default_factory=dict)
    library: Literal["kafka-python", "confluent"] = "kafka-python"
    # a record ts further than this past its Kafka timestamp is bad_ts: one record from the
    # far future would otherwise move event-time "now" and expire everything after it
    max_clock_skew: Annotated[float, DURATION, Range(1.0, 7 * DAY)] = 3600.0
    # v3: joined samples keyed by model, for one owner per model's recalibration (§7)
    joined_topic: str | None = None


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

    def for_labels(self) -> FieldsConfig:
        """The paths the labels topic is read with: ``labels.*`` where set, else ours."""
        if self.labels is None:
            return self
        own = {k: v for k, v in dataclasses.asdict(self.labels).items() if v is not None}
        return dataclasses.replace(self, **own, labels=None)


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
    method: Literal["temperature", "platt", "isotonic", "histogram", "auto"] = "temperature"
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
    join: JoinConfig = field(default_factory=JoinConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    segments: SegmentsConfig = field(default_factory=SegmentsConfig)
    recalibration: RecalibrationConfig = field(default_factory=RecalibrationConfig)
    calibrators: CalibratorsConfig = field(default_factory=CalibratorsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    state: StateConfig = field(default_factory=StateConfig)

    def window(self, name: str) -> Window:
        """The configured window called ``name``. Raises KeyError when there is none."""
        for w in self.metrics.windows:
            if w.name == name:
                return w
        raise KeyError(name)


# ---------------------------------------------------------------- loading

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(data: Any, env: Mapping[str, str], path: str, errors: list[str]) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in string values (never in comments).

    The result is always a string, never re-read as YAML (``007`` stays ``"007"``,
    ``on`` stays ``"on"``, ``a: b`` stays a string); ``_convert`` reads a string as a
    number where the key needs one. An unset VAR without a default is an error, never
    an empty string.
    """
    if isinstance(data, dict):
        return {k: expand_env(v, env, _join(path, str(k)), errors) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, env, f"{path}[{i}]", errors) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        errors.append(f"{path or '(top)'}: environment variable {name} is not set")
        return ""

    return _ENV_RE.sub(sub, data)


def load(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate a config file; ``None`` gives the defaults.

    Raises ConfigError listing every problem when the file is unreadable or invalid.
    """
    if path is None:
        return Config()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read ({e.strerror})"]) from None
    return loads(text, env)


def loads(text: str, env: Mapping[str, str] | None = None) -> Config:
    """Validate YAML text. Raises ConfigError listing every problem."""
    # ``${...}`` is not valid YAML inside a flow mapping ({index: ${I}, count: 2}):
    # hide each reference behind a plain-scalar placeholder while parsing, then put
    # it back, so it is expanded wherever it stands (and, in a comment, nowhere).
    refs: list[str] = []

    def hide(m: re.Match[str]) -> str:
        refs.append(m.group(0))
        return f"{_REF_MARK}{len(refs) - 1}__"

    try:
        data = safe_load(_ENV_RE.sub(hide, text))
    except yaml.YAMLError as e:
        raise ConfigError([f"(file): not valid YAML: {e}"]) from None
    except RecursionError:
        raise ConfigError(["(file): nested too deeply"]) from None
    return from_dict({} if data is None else _unhide(data, refs), env)


MAX_YAML_NODES = 100_000  # a config is a few hundred; an alias bomb is 10^9 and more


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses a document whose aliases expand past MAX_YAML_NODES.

    An alias is shared, not copied, while loading, but every walk over the result
    (environment expansion, conversion, printing) expands it: 481 bytes of nested
    aliases become 10^10 nodes. Counting the expanded size of the node graph (each
    node's size computed once) costs time in the size of the text."""

    def construct_document(self, node: yaml.Node) -> Any:
        sizes: dict[int, int] = {}
        if _expanded_size(node, sizes, set()) > MAX_YAML_NODES:
            raise yaml.YAMLError(f"the document expands to more than {MAX_YAML_NODES:,} "
                                 "values (YAML aliases nested too deep)")
        return super().construct_document(node)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:  # an alias of a node inside itself: infinite once expanded
        return MAX_YAML_NODES + 1
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_size(child, sizes, open_)
            if total > MAX_YAML_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_)
            if total > MAX_YAML_NODES:
                break
    open_.discard(key)
    sizes[key] = total
    return total


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with aliases bounded (see ``_BoundedLoader``)."""
    return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass


_REF_MARK = "__calmon_env_ref_"
_REF_RE = re.compile(re.escape(_REF_MARK) + r"(\d+)__")


def _unhide(data: Any, refs: list[str]) -> Any:
    if isinstance(data, dict):
        return {_unhide(k, refs): _unhide(v, refs) for k, v in data.items()}
    if isinstance(data, list):
        return [_unhide(v, refs) for v in data]
    if isinstance(data, str) and _REF_MARK in data:
        return _REF_RE.sub(lambda m: refs[int(m.group(1))] if int(m.group(1)) < len(refs)
                           else m.group(0), data)
    return data


def from_dict(data: Any, env: Mapping[str, str] | None = None) -> Config:
    """Validate an already-parsed mapping. Raises ConfigError listing every problem."""
    errors: list[str] = []
    data = expand_env(data, os.environ if env is None else env, "", errors)
    cfg = _convert(data, Config, "", errors)
    if not errors:
        _cross_checks(cfg, errors)
    if errors:
        raise ConfigError(errors)
    assert isinstance(cfg, Config)  # _convert returns None only with errors
    return cfg


def _cross_checks(cfg: Config, errors: list[str]) -> None:
    for path, value in (("kafka.bootstrap_servers", cfg.kafka.bootstrap_servers),
                        ("metrics.windows", cfg.metrics.windows)):
        if not value:
            errors.append(f"{path}: must not be empty")
    for i, sl in enumerate(cfg.segments.slices):
        if not sl:
            errors.append(f"segments.slices[{i}]: a slice needs at least one key")
    inst = cfg.kafka.instance
    if inst is not None and inst.index >= inst.count:
        errors.append(f"kafka.instance.index: must be below count ({inst.count}), got {inst.index}")
    if cfg.metrics.fine_bins < cfg.metrics.bins:
        errors.append("metrics.fine_bins: must be at least metrics.bins")
    names = [w.name for w in cfg.metrics.windows]
    if len(set(names)) != len(names):
        errors.append("metrics.windows: windows must be distinct")
    if cfg.recalibration.window not in names:
        errors.append(f"recalibration.window: must be one of metrics.windows {names}, "
                      f"got {cfg.recalibration.window!r}")
    if cfg.recalibration.triggers.classwise_ece_above is not None and not cfg.metrics.classwise:
        # the trigger reads the classwise ECE, which only metrics.classwise computes
        errors.append("recalibration.triggers.classwise_ece_above: needs metrics.classwise: true")
    for i, wname in enumerate(cfg.metrics.export.windows or ()):
        if wname not in names:
            errors.append(f"metrics.export.windows[{i}]: must be one of metrics.windows "
                          f"{names}, got {wname!r}")
    _check_keys(cfg, errors)
    from calmon.io.exporter import FAMILIES  # the exporter owns the names (lazily: it imports us)

    for key in ("families", "segment_families"):
        for i, fam in enumerate(getattr(cfg.metrics.export, key) or ()):
            if fam not in FAMILIES:
                errors.append(f"metrics.export.{key}[{i}]: unknown family {fam!r}")
    band = cfg.recalibration.triggers.observed_over_expected
    if band is not None and not (0 < band[0] < band[1]):
        errors.append("recalibration.triggers.observed_over_expected: need 0 < low < high")
    ml = cfg.join.missing_label
    if ml is not None and ml.after > cfg.join.ttl:
        errors.append("join.missing_label.after: must not exceed join.ttl")
    if cfg.kafka.library == "confluent" and not _confluent_importable():
        errors.append("kafka.library: confluent needs the confluent-kafka package "
                      "(pip install 'calmon[fast]'), which cannot be imported here")
    if cfg.kafka.predictions_topic == cfg.kafka.labels_topic:
        errors.append("kafka.labels_topic: must differ from kafka.predictions_topic")
    if inst is not None and inst.index < inst.count > 1 and cfg.recalibration.enabled:
        # scaled out, one owner per model recalibrates on every instance's samples (§7)
        if cfg.kafka.joined_topic is None:
            errors.append("kafka.joined_topic: required with kafka.instance.count > 1 and "
                          "recalibration enabled (every instance's joined samples reach "
                          "each model's one owner through it)")
        if cfg.kafka.calibrators_topic is None:
            errors.append("kafka.calibrators_topic: required with kafka.instance.count > 1 "
                          "and recalibration enabled (versions come from it, not from a "
                          "local output_dir)")
    jt = cfg.kafka.joined_topic
    if jt is not None and jt in (cfg.kafka.predictions_topic, cfg.kafka.labels_topic,
                                 cfg.kafka.calibrators_topic, cfg.kafka.dead_letter_topic):
        errors.append("kafka.joined_topic: must be a topic of its own")


def _check_keys(cfg: Config, errors: list[str]) -> None:
    """calibrators: keys that parse, and a signing key that calmon's own readers accept."""
    from calmon.calibrators.signing import Signer, public_key
    from calmon.errors import CalibratorError

    cal = cfg.calibrators
    if cal.key_id is not None and cal.signing_key is None:
        errors.append("calibrators.key_id: needs calibrators.signing_key")
    signer = None
    if cal.signing_key is not None:
        if not cal.key_id:
            errors.append("calibrators.key_id: needed with calibrators.signing_key (it names "
                          "the key in every signature)")
        else:
            try:  # the message never quotes the key
                signer = Signer(cal.signing_key, cal.key_id)
            except CalibratorError as e:
                errors.append(f"calibrators.signing_key: {e}")
    ids = [k.id for k in cal.verify_keys]
    if len(set(ids)) != len(ids):
        errors.append("calibrators.verify_keys: key ids must be distinct")
    publics: dict[str, Any] = {}
    for i, k in enumerate(cal.verify_keys):
        if not k.id:
            errors.append(f"calibrators.verify_keys[{i}].id: must not be empty")
        try:
            publics[k.id] = public_key(k.public_key)
        except CalibratorError as e:
            errors.append(f"calibrators.verify_keys[{i}].public_key: {e}")
    if not cal.verify_keys or errors:
        return
    if signer is None:
        if cfg.recalibration.enabled:
            errors.append("calibrators.signing_key: needed when calibrators.verify_keys is set "
                          "and recalibration is enabled (calmon's own readers would refuse "
                          "every document it publishes unsigned)")
    elif signer.key_id not in publics:
        errors.append(f"calibrators.key_id: {signer.key_id!r} is not among "
                      "calibrators.verify_keys (calmon's own readers would refuse it)")
    else:
        from calmon.calibrators.signing import raw_public

        if raw_public(publics[signer.key_id]) != base64.b64decode(signer.public_key):
            errors.append(f"calibrators.verify_keys: the key with id {signer.key_id!r} is not "
                          "the public half of calibrators.signing_key")


def _confluent_importable() -> bool:
    try:
        import confluent_kafka  # noqa: F401 - only whether it loads (with its librdkafka)
    except ImportError:
        return False
    return True


_INT_TEXT = re.compile(r"\s*[+-]?\d{1,30}\s*")
_FLOAT_TEXT = re.compile(r"\s*[+-]?(\d{1,30}(\.\d{0,30})?|\.\d{1,30})([eE][+-]?\d{1,3})?\s*")


def _describe(v: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping", type(None): "null"}.get(type(v), type(v).__name__)
    return f"{kind} {v!r}" if not isinstance(v, dict | list) else kind


def _convert(v: Any, tp: Any, path: str, errors: list[str]) -> Any:
    """Turn parsed YAML into ``tp``; on a problem append to ``errors`` and return None."""
    here = path or "(top)"
    origin = get_origin(tp)
    if origin is Annotated:
        base, *marks = get_args(tp)
        spell: Any = None
        if DURATION in marks:
            if not isinstance(v, str):
                errors.append(f"{here}: expected a duration like 30s, 15m, 24h, got {_describe(v)}")
                return None
            try:
                out = parse_duration(v)
            except ValueError as e:
                errors.append(f"{here}: {e}")
                return None
            spell, shown = format_duration, v.strip()
        elif SIZE in marks:
            if isinstance(v, bool) or not isinstance(v, int | str):
                errors.append(f"{here}: expected a size like 512MiB or 2GiB, got {_describe(v)}")
                return None
            try:
                out = parse_size(v)
            except ValueError as e:
                errors.append(f"{here}: {e}")
                return None
            spell, shown = format_size, str(v).strip()
        else:
            out = _convert(v, base, path, errors)
            shown = repr(out)
        for m in marks:
            if isinstance(m, Range) and isinstance(out, int | float):
                problem = m.check(out, spell)
                if problem:
                    errors.append(f"{here}: {problem}, got {shown}")
                    return None
        return out
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if v is None:
            return None
        return _convert(v, args[0], path, errors)
    if origin is Literal:
        allowed = get_args(tp)
        if v not in allowed:
            choices = ", ".join(map(str, allowed))
            errors.append(f"{here}: must be one of {choices}, got {_describe(v)}")
            return None
        return v
    if tp is Window:
        return _convert_window(v, here, errors)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(v, tp, path, errors)
    # ${VAR} always gives a string: a key that needs a number (or a boolean) reads the
    # string as one, so `index: ${POD_INDEX}` works and `port: "80a"` is still an error
    if tp is bool:
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        if not isinstance(v, bool):
            errors.append(f"{here}: expected true or false, got {_describe(v)}")
            return None
        return v
    if tp is int:
        if isinstance(v, str) and _INT_TEXT.fullmatch(v):
            return int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            errors.append(f"{here}: expected an integer, got {_describe(v)}")
            return None
        return v
    if tp is float:
        if isinstance(v, str) and _FLOAT_TEXT.fullmatch(v) and math.isfinite(float(v)):
            return float(v)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            errors.append(f"{here}: expected a number, got {_describe(v)}")
            return None
        return float(v)
    if tp is str:
        if not isinstance(v, str) or not v:
            errors.append(f"{here}: expected a non-empty string, got {_describe(v)}")
            return None
        return v
    if origin is tuple:
        return _convert_tuple(v, tp, path, errors)
    if origin is Mapping or tp is Mapping:
        if not isinstance(v, dict):
            errors.append(f"{here}: expected a mapping, got {_describe(v)}")
            return None
        return types.MappingProxyType(dict(v))
    raise TypeError(f"config type {tp!r} at {here} is not handled")  # a bug, not bad input


def _convert_tuple(v: Any, tp: Any, path: str, errors: list[str]) -> Any:
    args = get_args(tp)
    here = path or "(top)"
    if args == (str, ...) and isinstance(v, str):  # bootstrap_servers: "a:9092,b:9092"
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, list):
        errors.append(f"{here}: expected a list, got {_describe(v)}")
        return None
    if len(args) == 2 and args[1] is Ellipsis:
        n = len(errors)
        out = tuple(_convert(x, args[0], f"{path}[{i}]", errors) for i, x in enumerate(v))
        return out if len(errors) == n else None
    if len(v) != len(args):
        errors.append(f"{here}: expected a list of {len(args)} values, got {len(v)}")
        return None
    n = len(errors)
    out = tuple(_convert(x, a, f"{path}[{i}]", errors) for i, (x, a) in enumerate(zip(v, args)))
    return out if len(errors) == n else None


def _convert_window(v: Any, here: str, errors: list[str]) -> Window | None:
    if not isinstance(v, str):
        errors.append(f"{here}: expected a duration like 1h, got {_describe(v)}")
        return None
    try:
        seconds = parse_duration(v)
    except ValueError as e:
        errors.append(f"{here}: {e}")
        return None
    problem = WINDOW_RANGE.check(seconds, format_duration)
    if problem:
        errors.append(f"{here}: {problem}, got {v.strip()}")
        return None
    return Window(v.strip(), seconds)


def _convert_dataclass(v: Any, tp: Any, path: str, errors: list[str]) -> Any:
    here = path or "(top)"
    if not isinstance(v, dict):
        errors.append(f"{here}: expected a mapping, got {_describe(v)}")
        return None
    hints = typing.get_type_hints(tp, include_extras=True)
    names = [f.name for f in dataclasses.fields(tp)]
    for key in v:
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            errors.append(f"{_join(path, str(key))}: unknown key{hint}")
    kwargs: dict[str, Any] = {}
    n = len(errors)
    for f in dataclasses.fields(tp):
        if f.name not in v:
            has_default = (f.default is not dataclasses.MISSING
                           or f.default_factory is not dataclasses.MISSING)
            if not has_default:
                errors.append(f"{_join(path, f.name)}: required")
            continue
        kwargs[f.name] = _convert(v[f.name], hints[f.name], _join(path, f.name), errors)
    if len(errors) != n:
        return None
    return tp(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---------------------------------------------------------------- printing


def to_dict(cfg: Any) -> Any:
    """The effective config as plain YAML-able data, durations spelt as durations."""
    if isinstance(cfg, Window):
        return cfg.name
    if dataclasses.is_dataclass(cfg):
        hints = typing.get_type_hints(type(cfg), include_extras=True)
        out = {}
        for f in dataclasses.fields(cfg):
            val = getattr(cfg, f.name)
            is_dur = DURATION in getattr(hints[f.name], "__metadata__", ())
            out[f.name] = format_duration(val) if is_dur and val is not None else to_dict(val)
        return out
    if isinstance(cfg, tuple):
        return [to_dict(x) for x in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(x) for k, x in cfg.items()}
    return cfg


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)
