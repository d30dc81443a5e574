"""Input topic settings that need DescribeConfigs: logged as warnings, never a refusal
(some Kafka-compatible brokers do not answer DescribeConfigs, and either setting
may be deliberate).

- ``cleanup.policy`` with ``compact``: compaction keeps only the newest record of a
  key, so records calmon has not read yet can disappear.
- ``retention.ms`` shorter than the largest window: a calmon stopped or lagging for
  longer loses records, and a replay (drain and replay, a lost state) cannot
  rebuild the windows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from calmon.config import KafkaConfig

log = logging.getLogger(__name__)

ROLES = ("predictions_topic", "labels_topic")


def warnings_for(key: str, topic: str, configs: Mapping[str, str | None],
                 longest_window_s: float) -> list[str]:
    """What to warn about one topic's configuration (``key``: its config key)."""
    out = []
    policy = configs.get("cleanup.policy") or ""
    if "compact" in policy.replace(" ", "").split(","):
        out.append(f"kafka.{key}: topic {topic!r} has cleanup.policy {policy}: compaction "
                   "keeps only the newest record of a key, so records calmon has not read "
                   "yet can disappear; input topics should use delete")
    try:
        retention_ms = int(configs.get("retention.ms") or -1)
    except ValueError:
        retention_ms = -1
    if 0 <= retention_ms < longest_window_s * 1000:
        out.append(f"kafka.{key}: topic {topic!r} keeps records for {retention_ms / 3.6e6:g} "
                   f"h (retention.ms), less than the largest window "
                   f"({longest_window_s / 3600:g} h): a calmon stopped or lagging for longer "
                   "loses records, and a replay cannot rebuild its windows")
    return out


def describe(config: KafkaConfig, timeout_s: float) -> dict[str, dict[str, str | None]]:
    """Both input topics' configuration, through the configured library's admin client.
    Raises Exception (the library's own) when the broker does not answer."""
    topics = [config.predictions_topic, config.labels_topic]
    servers = ",".join(config.bootstrap_servers)
    if config.library == "confluent":
        from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

        from calmon.io.confluent_settings import (
            CONSUMER_ONLY,
            LibrdkafkaLog,
            librdkafka_settings,
        )

        settings: dict[str, Any] = {
            k: v for k, v in librdkafka_settings(config.client, role="consumer").items()
            if k not in CONSUMER_ONLY}  # the connection and security settings
        settings.update({"bootstrap.servers": servers, "logger": LibrdkafkaLog()})
        admin = AdminClient(settings)  # held until the answers are in: its end cancels them
        futures = admin.describe_configs([ConfigResource("topic", t) for t in topics],
                                         request_timeout=timeout_s)
        out = {res.name: {k: v.value for k, v in fut.result(timeout=timeout_s).items()}
               for res, fut in futures.items()}
        del admin
        return out
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as Resource
    from kafka.admin import ConfigResourceType

    from calmon.io.topics import client_settings

    settings = client_settings(config.client, KafkaAdminClient.DEFAULT_CONFIG, role="admin")
    settings.update(bootstrap_servers=list(config.bootstrap_servers),
                    request_timeout_ms=int(timeout_s * 1000))
    client = KafkaAdminClient(**settings)
    try:
        got = client.describe_configs(
            [Resource(ConfigResourceType.TOPIC, t, None) for t in topics],
            config_filter="all")
    finally:
        client.close()
    return {t: {k: (v or {}).get("value") for k, v in entries.items()}
            for t, entries in got.get("topic", {}).items()}


def check(config: KafkaConfig, longest_window_s: float, timeout_s: float = 5.0) -> list[str]:
    """Log (and return) the warnings about both input topics; a broker that does not
    answer is noted at info level and is not a problem."""
    try:
        described = describe(config, timeout_s)
    except Exception as e:  # any library's error: this check must never stop calmon
        log.info("input topic configuration not checked (DescribeConfigs: %s)", e)
        return []
    out = []
    for key in ROLES:
        topic = getattr(config, key)
        for warning in warnings_for(key, topic, described.get(topic, {}), longest_window_s):
            log.warning("%s", warning)
            out.append(warning)
    return out
