"""/metrics bodies shared by every request of the same state.

The window families (the bulk of the exposition: a few gauges per model, segment
and window) are rendered once per snapshot and format, and compressed once when a
client asks for gzip; concurrent scrapes of one snapshot share those bytes. The
rest (process counters, recalibration state, the process collector: small, and
changing with every batch) is rendered per request and appended: as more plain
bytes, or through a copy of the compressor the shared part left off at, so the
answer is one ordinary gzip stream. The parts are written one after the other, so
a scrape never joins them into a second copy of the body.

``Exposition.render`` is the one writer of a /metrics body, for each format
prometheus-client negotiates (text 0.0.4, OpenMetrics): the daemon's, and the
HTTP server's over a bare registry alike. ``new_registry`` is the one way calmon
makes a registry: every collector describes its families, so a family two
collectors would both write is refused when the second one is registered.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector, CollectorRegistry

EOF = b"# EOF\n"
GZIP_LEVEL = 6  # zlib's default: most of level 9's ratio on this text, at a fraction of its time


def new_registry(*collectors: Collector) -> CollectorRegistry:
    """A fresh registry holding ``collectors``. Registering one whose ``describe()``
    names a family already there raises ValueError (auto_describe: a collector
    without ``describe`` is collected once to find its names)."""
    registry = CollectorRegistry(auto_describe=True)
    for c in collectors:
        registry.register(c)
    return registry


def standard_collectors() -> list[Collector]:
    """prometheus-client's process_* and python_info collectors, not yet registered."""
    return [ProcessCollector(registry=None), PlatformCollector(registry=None)]


class _Collectors:
    """What the prometheus-client encoders read: anything with ``collect()``."""

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Any]:
        for c in self.collectors:
            yield from c.collect()


@dataclass
class _Shared:
    key: Hashable
    body: bytes
    gz_prefix: bytes | None = None
    gz_state: Any = None  # a zlib compressor after gz_prefix, copied per request


class Exposition:
    """``render(accept, accept_encoding)`` -> (content type, content encoding or None,
    body parts). ``key()`` names the state the shared part was rendered from (the
    snapshot): a new key renders it again, once, whichever request comes first."""

    def __init__(self, shared: Collector | None, key: Callable[[], Hashable],
                 others: Sequence[Collector]) -> None:
        """``shared``: None when every family is rendered per request (``others``)."""
        self.shared = _Collectors([] if shared is None else [shared])
        self.key = key
        self.others = _Collectors(others)
        self._lock = threading.Lock()
        self._cache: dict[str, _Shared] = {}  # content type -> the latest shared part
        self.builds = 0  # renders of the shared part (tests count them)

    def render(self, accept: str, accept_encoding: str) -> tuple[str, str | None, list[bytes]]:
        encoder, ctype = choose_encoder(accept)
        gz = gzip_accepted(accept_encoding)
        with self._lock:  # one render per state and format: concurrent scrapes wait for it
            key = self.key()
            entry = self._cache.get(ctype)
            if entry is None or entry.key != key:
                body = self._render_shared(encoder, ctype)
                entry = self._cache[ctype] = _Shared(key, body)
                self.builds += 1
            if gz and entry.gz_state is None:
                co = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: a gzip stream
                entry.gz_prefix = co.compress(entry.body) + co.flush(zlib.Z_SYNC_FLUSH)
                entry.gz_state = co
        rest = encoder(self.others)
        if gz:
            assert entry.gz_prefix is not None
            co = entry.gz_state.copy()
            return ctype, "gzip", [entry.gz_prefix, co.compress(rest) + co.flush()]
        return ctype, None, [entry.body, rest]

    def _render_shared(self, encoder: Callable[[Any], bytes], ctype: str) -> bytes:
        if not self.shared.collectors:
            return b""
        render = getattr(self.shared.collectors[0], "render", None)
        if render is not None:  # the same bytes, written directly (no end marker)
            body: bytes = render(ctype.startswith("application/openmetrics"))
        else:
            body = encoder(self.shared)
        if body.endswith(EOF):  # OpenMetrics: the end marker comes after the rest
            body = body[:-len(EOF)]
        return body
