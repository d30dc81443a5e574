"""config.yaml -> a frozen, typed Config, validated once at start (``load``).

``units`` holds the value kinds (durations, sizes, bounds), ``model`` the frozen
sections, ``convert`` the way parsed YAML becomes them (and back), ``checks`` what
holds across keys, ``loading`` the file, the environment and the YAML bounds.
Everything is importable from here: ``from calmon.config import Config, from_dict``.
"""

from calmon.config.checks import cross_checks
from calmon.config.convert import convert, dump, to_dict
from calmon.config.loading import MAX_YAML_NODES, expand_env, from_dict, load, loads, safe_load
from calmon.config.model import (
    EVERY_MODEL,
    THRESHOLD,
    WINDOW_RANGE,
    AlertsConfig,
    CalibratorsConfig,
    Config,
    EstimatesConfig,
    ExportConfig,
    FieldsConfig,
    Instance,
    JoinConfig,
    KafkaConfig,
    LabelFields,
    LimitsConfig,
    LoggingConfig,
    MetricsConfig,
    MissingLabel,
    ModelConfig,
    RecalibrationConfig,
    SegmentsConfig,
    ServerConfig,
    StateConfig,
    Triggers,
    VerifyKey,
    Window,
)
from calmon.config.units import (
    DAY,
    DURATION,
    GIB,
    HOUR,
    MIB,
    MINUTE,
    SIZE,
    TIB,
    YEAR,
    Duration,
    Range,
    Size,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)

__all__ = [
    "DAY", "DURATION", "EVERY_MODEL", "GIB", "HOUR", "MAX_YAML_NODES", "MIB", "MINUTE",
    "SIZE", "THRESHOLD", "TIB", "WINDOW_RANGE", "YEAR", "AlertsConfig", "CalibratorsConfig",
    "Config", "Duration", "EstimatesConfig", "ExportConfig", "FieldsConfig", "Instance",
    "JoinConfig", "KafkaConfig", "LabelFields", "LimitsConfig", "LoggingConfig",
    "MetricsConfig", "MissingLabel", "ModelConfig", "Range", "RecalibrationConfig",
    "SegmentsConfig", "ServerConfig", "Size", "StateConfig", "Triggers", "VerifyKey",
    "Window", "convert", "cross_checks", "dump", "expand_env", "format_duration",
    "format_size", "from_dict", "load", "loads", "parse_duration", "parse_size",
    "safe_load", "to_dict",
]
