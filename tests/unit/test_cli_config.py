"""``calmon check-config``: the repo's config, every error reported as
``path.to.key: ...`` with exit 2, environment expansion, defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import ERROR_LINE, config_error
from tests.cli_helpers import check_config as check
from tests.cli_helpers import run_cli as run
from tests.hostile_batches import ALIAS_BOMB

REPO = Path(__file__).resolve().parents[2]

# The contract's section 0, written out here rather than read from calmon.config.
CONTRACT_DEFAULTS = {
    "kafka": {"bootstrap_servers": ["localhost:9092"], "group_id": "calmon",
              "predictions_topic": "predictions", "labels_topic": "labels",
              "dead_letter_topic": None, "calibrators_topic": None,
              "auto_offset_reset": "earliest", "max_record_bytes": 1048576,
              "instance": None, "state_changelog_topic": None, "client": {},
              "library": "kafka-python",
              "max_clock_skew": "1h", "joined_topic": None},
    "limits": {"max_models": 100, "max_classes": 1000, "max_id_bytes": 256,
               "max_name_bytes": 128, "max_series": 5000, "memory": None},
    "fields": {"id": "id", "model": "model", "ts": "ts", "segment": "segment",
               "label": "label", "labels": None, "decision": None},
    "models": {},
    "estimates": {"calibration": "labelled", "min_samples": 1000, "samples": 50000},
    "join": {"ttl": "7d", "label_ttl": "1h", "max_pending": 1000000, "missing_label": None},
    "metrics": {"bins": 15, "fine_bins": 1000, "windows": ["1h", "24h", "7d"],
                "classwise": False, "mce_min_samples": 30, "interval_level": 0.9,
                "refresh": "30s",
                "export": {"windows": None, "bins": "models", "families": None,
                           "segment_families": ["ece", "ece_lower", "ece_upper",
                                                "window_samples", "calibrated_ece",
                                                "observed_over_expected"]}},
    "segments": {"slices": [["country"], ["device"]], "max_values": 50},
    "recalibration": {"enabled": True, "interval": "5m", "method": "temperature",
                      "per_segment": False, "min_samples": 2000, "buffer": 50000,
                      "holdout_fraction": 0.3, "cooldown": "1h", "alpha": 0.01,
                      "window": "24h", "retry_after": "6h",
                      "triggers": {"ece_above": 0.05, "ece_increase": 0.02,
                                   "observed_over_expected": [0.9, 1.1],
                                   "classwise_ece_above": None},
                      "output_dir": "./calibrators"},
    "calibrators": {"signing_key": None, "key_id": None, "verify_keys": []},
    "alerts": {"webhook": None},
    "server": {"host": "0.0.0.0", "port": 9108, "web_config_file": None},
    "logging": {"level": "info", "format": "text"},
    "state": {"dir": "./state", "checkpoint_interval": "10s", "on_corrupt": "fail"},
}


def assert_subset(expected: dict, actual: dict, where: str = "") -> None:
    for key, value in expected.items():
        assert key in actual, f"{where}{key} missing"
        if isinstance(value, dict) and value:
            assert_subset(value, actual[key], f"{where}{key}.")
        else:
            assert actual[key] == value, f"{where}{key}: {actual[key]!r} != {value!r}"


def test_repo_config_is_valid_via_the_command_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALMON_")}
    proc = subprocess.run([sys.executable, "-m", "calmon", "check-config", "-c", "config.yaml"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    effective = yaml.safe_load(proc.stdout)
    assert_subset(CONTRACT_DEFAULTS, effective)


def test_effective_config_round_trips(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CALMON_BOOTSTRAP", raising=False)
    rc, out, err = run(capsys, "check-config", "-c", str(REPO / "config.yaml"))
    assert rc == 0, err
    rc2, out2, err2 = check(capsys, tmp_path, out)
    assert rc2 == 0, err2
    assert out2 == out


def test_every_error_is_reported_with_its_path(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, """
join:
  max_pendng: 10        # misspelt
  ttl: -5m              # negative duration
metrics:
  bins: fifteen         # a string where a number belongs
""")
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 3, err
    assert all(ERROR_LINE.match(line) for line in lines), err
    by_key = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines}
    assert set(by_key) == {"join.max_pendng", "join.ttl", "metrics.bins"}
    assert "max_pending" in by_key["join.max_pendng"]  # suggests the right spelling
    assert "-5m" in by_key["join.ttl"]
    assert "fifteen" in by_key["metrics.bins"]


def test_unknown_top_level_key(capsys, tmp_path: Path) -> None:
    rc, _, err = check(capsys, tmp_path, "metrcs:\n  bins: 10\nbogus: 1\n")
    assert rc == 2
    lines = err.strip().splitlines()
    assert all(ERROR_LINE.match(line) for line in lines), err
    keys = {line.split(": ", 1)[0] for line in lines}
    assert keys == {"metrcs", "bogus"}
    assert "metrics" in next(line for line in lines if line.startswith("metrcs:"))


@pytest.mark.parametrize(("text", "key"), [
    ("metrics:\n  windows: [1h, 0s]\n", "metrics.windows[1]"),
    ("join:\n  label_ttl: 5\n", "join.label_ttl"),
    ("server:\n  port: 70000\n", "server.port"),
    ("recalibration:\n  method: magic\n", "recalibration.method"),
    ("recalibration:\n  holdout_fraction: '1.5'\n", "recalibration.holdout_fraction"),
    ("kafka:\n  instance: {index: 2, count: 2}\n", "kafka.instance.index"),
    ("join:\n  ttl: 10m\n  missing_label: {value: 0, after: 30m}\n",
     "join.missing_label.after"),
    ("segments:\n  max_values: -1\n", "segments.max_values"),
    ("state:\n  checkpoint_interval: soon\n", "state.checkpoint_interval"),
    ("limits:\n  max_classes: 1048576\n", "limits.max_classes"),
    ("recalibration:\n  triggers: {classwise_ece_above: 0.05}\n",  # needs metrics.classwise
     "recalibration.triggers.classwise_ece_above"),
])
def test_single_errors_name_their_key(capsys, tmp_path: Path, text: str, key: str) -> None:
    rc, _, err = check(capsys, tmp_path, text)
    assert rc == 2
    lines = err.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [key], err
    assert all(ERROR_LINE.match(line) for line in lines), err


def test_env_expansion(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POD_INDEX", "1")
    monkeypatch.setenv("CALMON_TEST_MAXP", "5000")
    monkeypatch.setenv("CALMON_TEST_HOST", "kafka-0")
    monkeypatch.delenv("CALMON_TEST_UNSET", raising=False)
    rc, out, err = check(capsys, tmp_path, """
kafka:
  bootstrap_servers: "${CALMON_TEST_HOST}:9092"
  group_id: ${CALMON_TEST_UNSET:-calmon-fallback}
  instance: {index: ${POD_INDEX}, count: 2}
  joined_topic: calmon-joined       # both required when scaled out with recalibration
  calibrators_topic: calmon-calibrators
join:
  max_pending: ${CALMON_TEST_MAXP}
  label_ttl: ${CALMON_TEST_UNSET:-15m}
state:
  dir: /var/lib/calmon/${POD_INDEX}   # ${NOT_EXPANDED_IN_COMMENTS}
""")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["kafka"]["bootstrap_servers"] == ["kafka-0:9092"]
    assert eff["kafka"]["group_id"] == "calmon-fallback"
    assert eff["kafka"]["instance"] == {"index": 1, "count": 2}  # an integer, not "1"
    assert eff["join"]["max_pending"] == 5000
    assert eff["join"]["label_ttl"] == "15m"
    assert eff["state"]["dir"] == "/var/lib/calmon/1"

    monkeypatch.setenv("CALMON_TEST_UNSET", "from-env")
    rc, out, err = check(capsys, tmp_path, "kafka:\n  group_id: ${CALMON_TEST_UNSET:-x}\n")
    assert rc == 0, err
    assert yaml.safe_load(out)["kafka"]["group_id"] == "from-env"


def test_env_errors(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CALMON_TEST_UNSET", raising=False)
    monkeypatch.setenv("CALMON_TEST_WORD", "lots")
    rc, out, err = check(capsys, tmp_path, """
kafka:
  group_id: ${CALMON_TEST_UNSET}
join:
  max_pending: ${CALMON_TEST_WORD}
""")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert all(ERROR_LINE.match(line) for line in lines), err
    by_key: dict[str, str] = {}
    for line in lines:
        key, what = line.split(": ", 1)
        by_key[key] = by_key.get(key, "") + what + "\n"
    assert set(by_key) == {"kafka.group_id", "join.max_pending"}
    assert "CALMON_TEST_UNSET" in by_key["kafka.group_id"]  # the variable is named
    assert "lots" in by_key["join.max_pending"]


def test_defaults_when_keys_are_absent(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, "# nothing set\n")
    assert rc == 0, err
    assert_subset(CONTRACT_DEFAULTS, yaml.safe_load(out))

    rc, out, err = check(capsys, tmp_path, "metrics:\n  bins: 10\njoin:\n  ttl: 2d\n")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["metrics"] == {**CONTRACT_DEFAULTS["metrics"], "bins": 10}
    assert eff["join"] == {**CONTRACT_DEFAULTS["join"], "ttl": "2d"}
    assert eff["segments"] == CONTRACT_DEFAULTS["segments"]


def test_durations_and_missing_label(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, """
join:
  missing_label: {value: 0, after: 30m}
metrics:
  windows: [90m, 24h]
recalibration:
  window: 24h
  interval: 1s
  cooldown: 1s
state:
  checkpoint_interval: 500ms
""")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["join"]["missing_label"] == {"value": 0, "after": "30m"}
    assert eff["metrics"]["windows"] == ["90m", "24h"]
    assert eff["recalibration"]["interval"] == "1s"
    assert eff["recalibration"]["cooldown"] == "1s"
    assert eff["state"]["checkpoint_interval"] == "500ms"


@pytest.mark.parametrize(("text", "key", "why"), [
    ("metrics:\n  windows: [1h, 30s]\n", "metrics.windows[1]", "must be >= 1m, got 30s"),
    ("metrics:\n  windows: [1h, 400d]\n", "metrics.windows[1]", "must be <= 365d, got 400d"),
    ("recalibration:\n  interval: 500ms\n", "recalibration.interval", "must be >= 1s"),
    ("recalibration:\n  interval: 1ms\n", "recalibration.interval", "must be >= 1s"),
    ("recalibration:\n  cooldown: 999ms\n", "recalibration.cooldown", "must be >= 1s"),
    ("recalibration:\n  buffer: 100000000\n", "recalibration.buffer",
     "must be <= 10000000, got 100000000"),
    ("join:\n  ttl: 30s\n", "join.ttl", "must be >= 1m"),
    ("join:\n  label_ttl: 5000d\n", "join.label_ttl", "must be <= 365d"),
    ("join:\n  max_pending: 1000000000\n", "join.max_pending", "must be <="),
    ("metrics:\n  refresh: 2d\n", "metrics.refresh", "must be <= 1d"),
    ("kafka:\n  max_clock_skew: 30d\n", "kafka.max_clock_skew", "must be <= 7d"),
    ("kafka:\n  max_record_bytes: 1\n", "kafka.max_record_bytes", "must be >= 64"),
    ("limits:\n  memory: 1KiB\n", "limits.memory", "must be >= 16MiB, got 1KiB"),
    ("limits:\n  max_id_bytes: 10000000\n", "limits.max_id_bytes", "must be <="),
    ("state:\n  checkpoint_interval: 10ms\n", "state.checkpoint_interval",
     "must be >= 100ms"),
])
def test_durations_and_sizes_are_range_checked(capsys, tmp_path: Path, text: str, key: str,
                                               why: str) -> None:
    got_key, got_why = config_error(capsys, tmp_path, text)
    assert ERROR_LINE.match(f"{got_key}: {got_why}")
    assert got_key == key
    assert why in got_why


def test_env_values_stay_strings(capsys, tmp_path: Path, monkeypatch) -> None:
    # as Kubernetes and Compose do: ${VAR} is text, never re-read as YAML
    monkeypatch.setenv("CALMON_TEST_GROUP", "007")
    monkeypatch.setenv("CALMON_TEST_TOPIC", "on")
    monkeypatch.setenv("CALMON_TEST_PW", "p@ss: wurd")
    monkeypatch.setenv("CALMON_TEST_NUMPW", "0123")
    monkeypatch.setenv("CALMON_TEST_PORT", " 9200 ")
    monkeypatch.setenv("CALMON_TEST_ALPHA", "5e-3")
    monkeypatch.setenv("CALMON_TEST_FLAG", "True")
    rc, out, err = check(capsys, tmp_path, """
kafka:
  group_id: ${CALMON_TEST_GROUP}
  predictions_topic: ${CALMON_TEST_TOPIC}
  client:
    sasl_plain_password: ${CALMON_TEST_PW}
    ssl_password: ${CALMON_TEST_NUMPW}
    request_timeout_ms: ${CALMON_TEST_PORT}
server:
  port: ${CALMON_TEST_PORT}
recalibration:
  alpha: ${CALMON_TEST_ALPHA}
  per_segment: ${CALMON_TEST_FLAG}
""")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["kafka"]["group_id"] == "007"  # not the integer 7
    assert eff["kafka"]["predictions_topic"] == "on"  # not true
    # keys that need a number or a boolean read the string as one
    assert eff["server"]["port"] == 9200
    assert eff["recalibration"]["alpha"] == 0.005
    assert eff["recalibration"]["per_segment"] is True
    # secrets masked whatever they look like; the clear text appears nowhere
    assert eff["kafka"]["client"]["sasl_plain_password"] == "***"
    assert eff["kafka"]["client"]["ssl_password"] == "***"
    assert "wurd" not in out and "0123" not in out


def test_a_secret_of_any_type_is_masked(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, """
kafka:
  client:
    sasl_plain_password: {p@ss: wurd}
    ssl_password: 7007
alerts:
  webhook: https://user:hunter22@am:9093/api/v2/alerts?token=tok-tok-1
""")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["kafka"]["client"] == {"sasl_plain_password": "***", "ssl_password": "***"}
    for clear in ("wurd", "p@ss", "7007", "hunter22", "tok-tok-1"):
        assert clear not in out


def test_numbers_from_strings_are_checked_as_numbers(capsys, tmp_path: Path,
                                                     monkeypatch) -> None:
    monkeypatch.setenv("CALMON_TEST_INDEX", "3")
    monkeypatch.setenv("CALMON_TEST_BAD", "1e400")
    rc, _, err = check(capsys, tmp_path, """
recalibration:
  alpha: ${CALMON_TEST_BAD}
  min_samples: "-5"
server:
  port: "9108x"
""")
    assert rc == 2
    by_key = dict(line.split(": ", 1) for line in err.strip().splitlines())
    assert set(by_key) == {"recalibration.alpha", "recalibration.min_samples", "server.port"}
    assert "1e400" in by_key["recalibration.alpha"]  # not finite: not a number
    assert "must be >= 1, got -5" in by_key["recalibration.min_samples"]
    assert "9108x" in by_key["server.port"]
    rc, _, err = check(capsys, tmp_path,
                       "kafka:\n  instance: {index: \"${CALMON_TEST_INDEX}\", count: 2}\n")
    assert rc == 2
    assert err.startswith("kafka.instance.index: must be below count (2), got 3")



@pytest.mark.parametrize("text", [
    ALIAS_BOMB,
    "a: &a [*a]\n",  # an alias inside itself
    "metrics:\n  windows: " + "[" * 20_000 + "]" * 20_000 + "\n",  # deep nesting
])
def test_alias_bombs_and_deep_nesting_are_refused(capsys, tmp_path: Path, text: str) -> None:
    rc, out, err = check(capsys, tmp_path, text)
    assert rc == 2 and out == ""
    assert err.startswith("(file): ")


def test_ordinary_anchors_still_work(capsys, tmp_path: Path) -> None:
    rc, out, err = check(capsys, tmp_path, """
segments:
  slices: &slices [[country], [device]]
  max_values: 7
recalibration:
  triggers: {observed_over_expected: &band [0.8, 1.25]}
""")
    assert rc == 0, err
    eff = yaml.safe_load(out)
    assert eff["segments"]["slices"] == [["country"], ["device"]]
    assert eff["recalibration"]["triggers"]["observed_over_expected"] == [0.8, 1.25]


def test_a_bound_is_written_as_configured(capsys, tmp_path: Path) -> None:
    rc, _, err = check(capsys, tmp_path, "limits:\n  max_classes: 1048576\n")
    assert rc == 2
    assert "limits.max_classes: must be <= 1048575, got 1048576" in err


def test_unreadable_file(capsys, tmp_path: Path) -> None:
    rc, out, err = run(capsys, "check-config", "-c", str(tmp_path / "nope.yaml"))
    assert rc == 2 and out == ""
    assert "nope.yaml" in err
