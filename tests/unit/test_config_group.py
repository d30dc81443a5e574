"""``kafka.instance: group`` (contract §8) in the config: the word, the changelog topic
and its default, the group settings of ``kafka.client`` checked in kafka-python spelling
and translated for librdkafka; errors as ``path.to.key: what is wrong``, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calmon.config import loads
from calmon.io.confluent_settings import librdkafka_settings
from calmon.io.topics import copartition_problem
from tests.unit.test_cli_config import ERROR_LINE, check

GROUP = "recalibration: {enabled: false}\nkafka:\n  instance: group\n  group_id: fleet\n"


def _load(_tmp_path: Path, text: str):
    return loads(text, env={})


def test_group_mode_and_the_changelog_default(tmp_path: Path) -> None:
    cfg = _load(tmp_path, GROUP)
    assert cfg.kafka.instance == "group"
    assert cfg.kafka.group and cfg.kafka.static is None
    assert cfg.kafka.changelog_topic == "fleet-state-changelog"
    named = _load(tmp_path, GROUP + "  state_changelog_topic: tasks\n")
    assert named.kafka.changelog_topic == "tasks"


def test_static_instance_still_reads_as_before(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "kafka:\n  instance: {index: 1, count: 3}\n"
                     "recalibration: {enabled: false}\n")
    assert not cfg.kafka.group
    assert cfg.kafka.static is not None and (cfg.kafka.static.index, cfg.kafka.static.count) \
        == (1, 3)


def test_effective_config_prints_the_word(capsys, tmp_path: Path) -> None:
    rc, out, _ = check(capsys, tmp_path, GROUP)
    assert rc == 0
    eff = yaml.safe_load(out)["kafka"]
    assert eff["instance"] == "group" and eff["state_changelog_topic"] is None


@pytest.mark.parametrize(("text", "key"), [
    ("kafka:\n  instance: flock\n", "kafka.instance"),
    (GROUP + "  client: {session_timeout_ms: soon}\n", "kafka.client.session_timeout_ms"),
    (GROUP + "  client: {max_poll_interval_ms: -5}\n", "kafka.client.max_poll_interval_ms"),
    (GROUP + "  client: {session_timeout_ms: 6000, heartbeat_interval_ms: 6000}\n",
     "kafka.client.heartbeat_interval_ms"),
    (GROUP + "  client: {group_instance_id: ''}\n", "kafka.client.group_instance_id"),
    # librdkafka refuses a consumer whose poll interval is below its session timeout
    (GROUP + "  library: confluent\n  client: {session_timeout_ms: 6000, "
     "max_poll_interval_ms: 3000}\n", "kafka.client.max_poll_interval_ms"),
    (GROUP + "  state_changelog_topic: predictions\n", "kafka.state_changelog_topic"),
    ("kafka:\n  state_changelog_topic: tasks\n", "kafka.state_changelog_topic"),
    # recalibration (on by default) reads the joined topic and the calibrators topic
    ("kafka:\n  instance: group\n  calibrators_topic: cal\n", "kafka.joined_topic"),
    ("kafka:\n  instance: group\n  joined_topic: joined\n", "kafka.calibrators_topic"),
])
def test_group_errors_name_their_key(capsys, tmp_path: Path, text: str, key: str) -> None:
    rc, _, err = check(capsys, tmp_path, text)
    assert rc == 2
    lines = err.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [key], err
    assert all(ERROR_LINE.match(line) for line in lines), err


def test_group_mode_recalibrates_through_the_joined_topic(capsys, tmp_path: Path) -> None:
    rc, _, err = check(capsys, tmp_path, "kafka:\n  instance: group\n  joined_topic: joined"
                       "\n  calibrators_topic: cal\n")
    assert rc == 0, err


def test_group_settings_from_the_environment_are_numbers(capsys, tmp_path: Path,
                                                         monkeypatch) -> None:
    monkeypatch.setenv("CALMON_TEST_SESSION", "6000")
    rc, _, err = check(capsys, tmp_path, GROUP + "  client: {session_timeout_ms: "
                       "${CALMON_TEST_SESSION}, heartbeat_interval_ms: 2000}\n")
    assert rc == 0, err


def test_a_poll_interval_below_the_session_is_kafka_python_s_alone(capsys,
                                                                  tmp_path: Path) -> None:
    rc, _, err = check(capsys, tmp_path, GROUP + "  client: {session_timeout_ms: 6000, "
                       "max_poll_interval_ms: 3000}\n")
    assert rc == 0, err


def test_group_settings_are_translated_for_librdkafka() -> None:
    client = {"session_timeout_ms": 6000, "max_poll_interval_ms": 10000,
              "heartbeat_interval_ms": 2000, "group_instance_id": "calmon-0"}
    assert librdkafka_settings(client, role="consumer") == {
        "session.timeout.ms": 6000, "max.poll.interval.ms": 10000,
        "heartbeat.interval.ms": 2000, "group.instance.id": "calmon-0"}
    # a producer has no group: none of them reach it
    assert librdkafka_settings(client, role="producer") == {}


def test_unequal_partition_counts_refuse_group_mode() -> None:
    problem = copartition_problem(("p", 6), ("l", 4), "group")
    assert problem is not None and problem.startswith("kafka.instance: group")
    assert copartition_problem(("p", 6), ("l", 6), "group") is None
