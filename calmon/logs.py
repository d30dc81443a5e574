"""Logging set-up: text for people, JSON lines for log pipelines; secrets masked in both.

``logging.format: json`` makes every line calmon writes to stderr one JSON object
with stable keys (``ts``, ``level``, ``logger``, ``message``, and ``exc`` when
there is a traceback): library warnings (through ``logging.captureWarnings``),
uncaught exceptions and the consumer process included, which reads the choice
from the environment it inherits. ``CALMON_LOG_LEVEL`` overrides
``logging.level``, so a pod's level changes without editing its ConfigMap.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from types import TracebackType
from typing import Any

from calmon import secrets
from calmon.config import LoggingConfig

LEVEL_ENV = "CALMON_LOG_LEVEL"
FORMAT_ENV = "CALMON_LOG_FORMAT"  # set by setup(); what child processes follow
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# chatty libraries: their INFO lines are not the operator's business
QUIET = {"kafka": logging.CRITICAL, "apscheduler": logging.ERROR}


class JsonFormatter(logging.Formatter):
    """One JSON object a line; the message masked as MaskingFormatter masks it."""

    def format(self, record: logging.LogRecord) -> str:
        message = secrets.mask_text(record.getMessage())
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            out["exc"] = secrets.mask_text(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = secrets.mask_text(self.formatStack(record.stack_info))
        # json.dumps escapes every control character: one record is one line
        return json.dumps(out, ensure_ascii=False, default=str)


def level_of(cfg: LoggingConfig) -> int:
    name = os.environ.get(LEVEL_ENV, "").strip().upper() or cfg.level.upper()
    level = logging.getLevelName(name)
    return level if isinstance(level, int) else logging.INFO


def setup(cfg: LoggingConfig) -> None:
    """Configure the root logger of this process (and, via the environment, of the
    processes it starts)."""
    os.environ[FORMAT_ENV] = cfg.format
    _configure(level_of(cfg), cfg.format)


def setup_child(level: int) -> None:
    """In a process calmon started: the parent's format, at ``level``."""
    _configure(level, os.environ.get(FORMAT_ENV, "text"))


def _configure(level: int, fmt: str) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json"
                         else secrets.MaskingFormatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) as log records, formatted alike
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else quiet)
    if fmt == "json":
        sys.excepthook = _log_uncaught


def _log_uncaught(tp: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:
    logging.getLogger("calmon").critical("uncaught exception", exc_info=(tp, value, tb))
