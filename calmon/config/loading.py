"""config.yaml -> a frozen, typed Config, validated once at start.

Every problem is reported, not just the first, as ``path.to.key: what is wrong``
(unknown keys included, so typos are caught). ``${VAR}`` and ``${VAR:-default}``
are expanded from the environment after parsing, always to a string (as
Kubernetes and Compose do), so one file serves every replica of a StatefulSet
and ``KAFKA_PASSWORD=007`` stays ``"007"``; a key that needs a number converts
the string and checks it as one. The YAML may use anchors and aliases, but the
document they expand to is bounded (``MAX_YAML_NODES``), so an alias bomb is
refused at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from calmon.config.checks import cross_checks
from calmon.config.convert import convert, join
from calmon.config.model import Config
from calmon.errors import ConfigError

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(data: Any, env: Mapping[str, str], path: str, errors: list[str]) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in string values (never in comments).

    The result is always a string, never re-read as YAML (``007`` stays ``"007"``,
    ``on`` stays ``"on"``, ``a: b`` stays a string); ``convert`` reads a string as a
    number where the key needs one. An unset VAR without a default is an error, never
    an empty string.
    """
    if isinstance(data, dict):
        return {k: expand_env(v, env, join(path, str(k)), errors) for k, v in data.items()}
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
    cfg = convert(data, Config, "", errors)
    if not errors:
        cross_checks(cfg, errors)
    if errors:
        raise ConfigError(errors)
    assert isinstance(cfg, Config)  # convert returns None only with errors
    return cfg
