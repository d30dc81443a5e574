"""Keep secrets out of config dumps and log lines.

Three rules, applied by ``mask_config`` (config dumps) and by ``MaskingFormatter``
(every log line of ``calmon run``):

- a value under a secret-looking key (``password``, ``token``, ``secret``,
  ``sasl_*`` apart from the mechanism, SSL key passwords, ...) becomes ``***``;
- in a URL, the user-info and every query value become ``***`` (webhook tokens
  live there: ``https://user:pw@host/hook?token=...``);
- a secret value registered with ``register`` (e.g. a password that came from
  ``${KAFKA_PASSWORD}``) is masked wherever it appears, even inside an
  exception message that a library wrote.

The formatter also escapes control characters in the message, so no input
(a model name with a newline, say) can forge a log line.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# Key names whose values are secrets. ``sasl_mechanism`` and the username are
# configuration a reader needs, so they stay visible.
_SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?|secret|token|credential|api_?key|private_?key|signing_?key|auth_?header"
    r"|^sasl_(?!mechanism$|plain_username$|kerberos_service_name$|kerberos_domain_name$)"
    r"|ssl_(key|keyfile|password|cafile_password)$|^authorization$|^cookie$",
    re.IGNORECASE)
# A URL with a scheme; stops at whitespace, quotes and brackets, so a URL inside a
# sentence or a repr() is found without its surroundings.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
# ``key=value`` / ``key: value`` / ``'key': 'value'`` for secret keys inside free text
# (a client settings dict in an exception message, for instance).
_KEY_VALUE = re.compile(
    r"(?P<key>['\"]?[A-Za-z_][A-Za-z0-9_.-]*['\"]?)(?P<sep>\s*[:=]\s*)"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s,;{}\[\]&()'\"]+)")
# C0, DEL and C1 (NEL, CSI, ...: terminals act on them too) and the Unicode separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MIN_SECRET_LEN = 4  # shorter registered values would mask ordinary words

_registered: set[str] = set()
_registered_lock = threading.Lock()


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def register(value: Any) -> None:
    """Remember a secret value so every later log line masks it wherever it appears."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LEN:
        with _registered_lock:
            _registered.add(value)
            # a PEM key may be logged a line at a time: each base64 line is a secret too
            _registered.update(line.strip() for line in value.splitlines()
                               if len(line.strip()) >= 16 and "-----" not in line)


def register_config(data: Any) -> None:
    """Register every value under a secret key, and URL credentials, of a config dict."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            if is_secret_key(str(k)):
                _register_all(v)
            else:
                register_config(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            register_config(v)
    elif isinstance(data, str) and "://" in data:
        parts = urlsplit(data)
        if parts.password:
            register(parts.password)
        for value in re.findall(r"=([^&]+)", parts.query):
            register(value)


def _register_all(value: Any) -> None:
    """Every leaf under a secret key, whatever its type (a password YAML read as a
    number or a mapping is still a password)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            register(str(k))
            _register_all(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _register_all(v)
    elif value is not None and not isinstance(value, bool):
        register(str(value))


def mask_url(url: str) -> str:
    """``scheme://***@host:port/path?key=***`` (user-info and query values masked)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # e.g. a port that is not a number: mask everything after the scheme
        scheme = url.split("://", 1)[0]
        return f"{scheme}://{MASK}"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{host}" + (f":{port}" if port is not None else "")
    query = "&".join(f"{q.split('=', 1)[0]}={MASK}" if "=" in q else MASK
                     for q in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_config(data: Any, key: str = "") -> Any:
    """A copy of a config-like structure with secrets masked (for dumps): whatever is
    under a secret key, a mapping or list included, is one ``***``."""
    if key and is_secret_key(key) and data is not None and not isinstance(data, bool):
        return MASK
    if isinstance(data, Mapping):
        return {k: mask_config(v, str(k)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [mask_config(v, key) for v in data]
    if isinstance(data, str) and "://" in data:  # URLs only: a group id "token-svc:x" stays
        return _URL.sub(lambda m: mask_url(m.group(0)), data)
    return data


def _mask_key_value(m: re.Match[str]) -> str:
    if not is_secret_key(m.group("key").strip("'\"")):
        return m.group(0)
    value = m.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{m.group('key')}{m.group('sep')}{quote}{MASK}{quote}"


def mask_text(text: str) -> str:
    """Free text (a log message, an exception) with URLs, secret key/values and
    registered secrets masked."""
    if _registered:  # first: the rules below could cut a registered value in two
        with _registered_lock:
            values = sorted(_registered, key=len, reverse=True)  # longest first
        for v in values:
            if v in text:
                text = text.replace(v, MASK)
    if "://" in text:
        text = _URL.sub(lambda m: mask_url(m.group(0)), text)
    if "=" in text or ":" in text:
        text = _KEY_VALUE.sub(_mask_key_value, text)
    return text


def escape_control(text: str) -> str:
    """Control characters as visible escapes (``\\n``, ``\\x1b``): one record, one line."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


class MaskingFormatter(logging.Formatter):
    """A Formatter whose output never holds a secret, and whose message part never
    holds a line break (tracebacks keep theirs, but are masked)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_control(mask_text(record.message))
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return mask_text(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return mask_text(super().formatStack(stack_info))


def install(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root) a MaskingFormatter with
    the same format string."""
    target = logger if logger is not None else logging.getLogger()
    for handler in target.handlers:
        old = handler.formatter
        fmt = old._fmt if old is not None else None
        datefmt = old.datefmt if old is not None else None
        handler.setFormatter(MaskingFormatter(fmt, datefmt))
