"""``/``: a page linking the endpoints, as every Prometheus exporter has one."""

from __future__ import annotations

import html

from calmon import __version__

ENDPOINTS = (
    ("/metrics", "Prometheus metrics (text format; gzip when asked for)"),
    ("/reliability", "reliability diagrams per model and segment, worst first "
                     "(?model=M&segment=S filters)"),
    ("/status", "JSON: readiness, pending joins, the last checkpoint, counters, positions"),
    ("/healthz", "liveness: 200 while the main loop runs"),
    ("/readyz", "readiness: 200 once state is restored and partitions are assigned, "
                "else 503 with the reason"),
)


def page(_query: dict[str, list[str]]) -> tuple[int, str, bytes]:
    items = "".join(f'<li><a href="{path}">{path}</a>: {html.escape(what)}</li>'
                    for path, what in ENDPOINTS)
    body = ("<!doctype html><html lang=en><head><meta charset=utf-8><title>calmon</title>"
            "<style>body{font:15px system-ui,sans-serif;margin:32px;max-width:48em}</style>"
            f"</head><body><h1>calmon {html.escape(__version__)}</h1>"
            "<p>Online calibration monitor: Kafka in, Prometheus out.</p>"
            f"<ul>{items}</ul></body></html>\n")
    return 200, "text/html; charset=utf-8", body.encode()
