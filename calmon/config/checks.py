"""What no single key can say: the checks across keys of a converted config."""

from __future__ import annotations

from typing import Any

from calmon.config.model import EVERY_MODEL, Config
from calmon.ed25519 import check_key_id, private_key, public_key, raw_public
from calmon.errors import CalibratorError
from calmon.names import FAMILIES


def cross_checks(cfg: Config, errors: list[str]) -> None:
    for path, value in (("kafka.bootstrap_servers", cfg.kafka.bootstrap_servers),
                        ("metrics.windows", cfg.metrics.windows)):
        if not value:
            errors.append(f"{path}: must not be empty")
    for i, sl in enumerate(cfg.segments.slices):
        if not sl:
            errors.append(f"segments.slices[{i}]: a slice needs at least one key")
    inst = cfg.kafka.static
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
    _check_group(cfg, errors)
    _check_models(cfg, errors)
    est = cfg.estimates
    if est.samples < est.min_samples:
        errors.append(f"estimates.samples: must be at least estimates.min_samples "
                      f"({est.min_samples}), got {est.samples}")
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
    scaled = cfg.kafka.group or (inst is not None and inst.index < inst.count > 1)
    if scaled and cfg.recalibration.enabled:
        # scaled out, one owner per model recalibrates on every instance's samples (§7, §8)
        shape = "kafka.instance: group" if cfg.kafka.group else "kafka.instance.count > 1"
        if cfg.kafka.joined_topic is None:
            errors.append(f"kafka.joined_topic: required with {shape} and recalibration "
                          "enabled (every instance's joined samples reach each model's "
                          "one owner through it)")
        if cfg.kafka.calibrators_topic is None:
            errors.append(f"kafka.calibrators_topic: required with {shape} and "
                          "recalibration enabled (versions come from it, not from a local "
                          "output_dir)")
    jt = cfg.kafka.joined_topic
    if jt is not None and jt in (cfg.kafka.predictions_topic, cfg.kafka.labels_topic,
                                 cfg.kafka.calibrators_topic, cfg.kafka.dead_letter_topic):
        errors.append("kafka.joined_topic: must be a topic of its own")


# v4: the group settings of kafka.client, in kafka-python spelling (§8)
GROUP_TIMEOUTS = ("session_timeout_ms", "max_poll_interval_ms", "heartbeat_interval_ms")


def _check_group(cfg: Config, errors: list[str]) -> None:
    """``kafka.instance: group``: the group's timeouts are whole milliseconds that a
    heartbeat fits in, and the changelog is a topic of its own."""
    kc = cfg.kafka
    ms: dict[str, int] = {}
    for key in GROUP_TIMEOUTS:
        v = kc.client.get(key)
        if v is None:
            continue
        text = v.strip() if isinstance(v, str) else v
        if isinstance(text, str) and text.isdigit():
            text = int(text)
        if isinstance(text, bool) or not isinstance(text, int) or text <= 0:
            errors.append(f"kafka.client.{key}: expected a positive number of milliseconds, "
                          f"got {v!r}")
            continue
        ms[key] = text
    hb, session = ms.get("heartbeat_interval_ms"), ms.get("session_timeout_ms", 45_000)
    if hb is not None and hb >= session:
        errors.append(f"kafka.client.heartbeat_interval_ms: must be below "
                      f"session_timeout_ms ({session}), got {hb}")
    poll = ms.get("max_poll_interval_ms")
    if kc.library == "confluent" and poll is not None and poll < session:
        # librdkafka refuses to make such a consumer (kafka-python takes it)
        errors.append(f"kafka.client.max_poll_interval_ms: must be at least "
                      f"session_timeout_ms ({session}) with kafka.library: confluent, "
                      f"got {poll}")
    gid = kc.client.get("group_instance_id")
    if gid is not None and (not isinstance(gid, str) or not gid.strip()):
        errors.append(f"kafka.client.group_instance_id: expected a non-empty name, got {gid!r}")
    if kc.state_changelog_topic is not None and not kc.group:
        errors.append("kafka.state_changelog_topic: only read with kafka.instance: group")
    if not kc.group:
        return
    if not kc.group_id:
        errors.append("kafka.group_id: required with kafka.instance: group")
    if kc.changelog_topic in (kc.predictions_topic, kc.labels_topic, kc.calibrators_topic,
                              kc.dead_letter_topic, kc.joined_topic):
        errors.append(f"kafka.state_changelog_topic: must be a topic of its own, got "
                      f"{kc.changelog_topic!r}")


def _check_models(cfg: Config, errors: list[str]) -> None:
    """models.<m>: a name a model could have, and classes a model could use (2 to
    limits.max_classes distinct names, each one a record may carry)."""
    lim = cfg.limits
    for name, entry in cfg.models.items():
        path = f"models.{name}"
        if name != EVERY_MODEL and _bytes(name) > lim.max_name_bytes:
            errors.append(f"{path}: a model name over limits.max_name_bytes "
                          f"({lim.max_name_bytes}) is never admitted")
        classes = entry.classes
        if classes is None:
            continue
        if not 2 <= len(classes) <= lim.max_classes:
            errors.append(f"{path}.classes: needs 2 to limits.max_classes "
                          f"({lim.max_classes}) names, got {len(classes)}")
        seen: set[str] = set()
        for i, cls in enumerate(classes):
            if _bytes(cls) > lim.max_name_bytes:
                errors.append(f"{path}.classes[{i}]: longer than limits.max_name_bytes "
                              f"({lim.max_name_bytes})")
            elif cls in seen:
                errors.append(f"{path}.classes[{i}]: {cls!r} is listed twice")
            seen.add(cls)


def _bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def _check_keys(cfg: Config, errors: list[str]) -> None:
    """calibrators: keys that parse, and a signing key that calmon's own readers accept."""
    cal = cfg.calibrators
    if cal.key_id is not None and cal.signing_key is None:
        errors.append("calibrators.key_id: needs calibrators.signing_key")
    signing = None  # the signing key's public half, raw
    if cal.signing_key is not None:
        if not cal.key_id:
            errors.append("calibrators.key_id: needed with calibrators.signing_key (it names "
                          "the key in every signature)")
        else:
            try:  # the message never quotes the key; the checks a Signer makes, in its order
                check_key_id(cal.key_id)
                signing = raw_public(private_key(cal.signing_key).public_key())
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
    if signing is None:
        if cfg.recalibration.enabled:
            errors.append("calibrators.signing_key: needed when calibrators.verify_keys is set "
                          "and recalibration is enabled (calmon's own readers would refuse "
                          "every document it publishes unsigned)")
    elif cal.key_id not in publics:
        errors.append(f"calibrators.key_id: {cal.key_id!r} is not among "
                      "calibrators.verify_keys (calmon's own readers would refuse it)")
    elif raw_public(publics[cal.key_id]) != signing:
        errors.append(f"calibrators.verify_keys: the key with id {cal.key_id!r} is not "
                      "the public half of calibrators.signing_key")


def _confluent_importable() -> bool:
    try:
        import confluent_kafka  # noqa: F401 - only whether it loads (with its librdkafka)
    except ImportError:
        return False
    return True
