"""A single-node Apache Kafka 4.4 (KRaft broker+controller) started from the jars
``tests/brokers/pom.xml`` fetches, on free loopback ports, with storage in a
directory of its own.

Listeners: PLAINTEXT for the tests (and the broker's own traffic), SASL_SSL
with a SCRAM-SHA-512 user and a PEM keystore signed by a throwaway CA, and the
controller's. Settings are a test cluster's: one partition and replication
factor 1 for ``__consumer_offsets`` and the transaction log, no initial
rebalance delay, ``message.max.bytes`` raised for the oversize-record tests.

The ports and the log directory stay the same across ``kill()`` and
``start()``, so a killed broker comes back with its data, as a real one does.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from calmon import children
from calmon.children import die_with_parent
from calmon.demo.broker import free_port

HERE = Path(__file__).resolve().parent
LIBS_ENV = "CALMON_KAFKA_LIBS"
DEFAULT_LIBS = HERE / "kafka-libs"
VERSION = "4.4.0"

SCRAM_USER = "calmon"
SCRAM_PASSWORD = "calmon-scram-secret"
MECHANISM = "SCRAM-SHA-512"


class Unavailable(Exception):
    """Raised by ``requirements()`` with the reason this machine cannot run the broker."""


def libs_dir() -> Path:
    return Path(os.environ.get(LIBS_ENV) or DEFAULT_LIBS)


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise Unavailable("no java on PATH (Apache Kafka 4.4 needs Java 17)")
    return candidate


def requirements() -> tuple[str, Path]:
    """(java, jar dir), or Unavailable saying what is missing."""
    libs = libs_dir()
    if not (libs / f"kafka_2.13-{VERSION}.jar").exists():
        raise Unavailable(f"no Apache Kafka {VERSION} jars in {libs} "
                          f"(mvn -q -f tests/brokers/pom.xml package)")
    java = java_binary()
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    banner = out.stderr or out.stdout
    try:
        major = int(banner.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        raise Unavailable(f"cannot read the Java version from {banner!r}") from None
    if major < 17:
        raise Unavailable(f"Java {major} found, Apache Kafka {VERSION} needs Java 17")
    return java, libs


@dataclass(frozen=True)
class Secured:
    """The SASL_SSL listener: where, who, and the CA that signed its certificate."""

    bootstrap: str
    username: str
    password: str
    mechanism: str
    ca_file: Path


def metadata_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a Metadata v4 request (no topics) gets its answer: Apache Kafka 4
    no longer serves versions 0-3, and the listener only opens once the broker
    has caught up with the metadata log."""
    client_id = b"calmon-test"
    correlation = 0x0CA2
    body = (struct.pack(">hhih", 3, 4, correlation, len(client_id)) + client_id
            + struct.pack(">i?", 0, False))  # topics = [], allow_auto_topic_creation
    try:
        with socket.create_connection((host, port), timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(body)) + body)
            head = sock.recv(8)
    except OSError:
        return False
    return len(head) == 8 and struct.unpack(">ii", head)[1] == correlation


class ApacheKafka:
    """One KRaft node in ``workdir``; ``start()`` formats the storage the first time."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path, *, heap: str = "768m") -> None:
        self.java, self.libs = requirements()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.sasl_port, self.controller_port = free_port(), free_port(), free_port()
        self.heap = heap
        self.log = workdir / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._formatted = False
        self.secured = self._make_tls()

    # ------------------------------------------------------------ addresses

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        if not self._formatted:
            self._format()
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self._properties())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while not metadata_ok(self.host, self.port):
            if self._proc.poll() is not None:
                raise RuntimeError(f"Apache Kafka exited with {self._proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"Apache Kafka not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)  # polling interval, bounded by the deadline above

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL past ``grace`` seconds."""
        proc, self._proc = self._proc, None
        children.stop(proc, grace)

    def kill(self) -> None:
        """Crash the broker (SIGKILL): the next start recovers its log directory."""
        proc, self._proc = self._proc, None
        children.kill(proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        return children.log_tail(self.log, lines)

    def __enter__(self) -> ApacheKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace=5.0)

    # ------------------------------------------------------------ setup

    def _java(self) -> list[str]:
        return [self.java, "-Xms128m", f"-Xmx{self.heap}", "-XX:+UseSerialGC",
                "-XX:-UsePerfData", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self._log4j()}",
                "-cp", str(self.libs / "*")]

    def _format(self) -> None:
        command = [*self._java(), "kafka.tools.StorageTool", "format", "--ignore-formatted",
                   "-t", uuid.uuid4().hex[:22], "-c", str(self._properties()),
                   "--add-scram", f"{MECHANISM}=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed:\n{done.stdout}\n{done.stderr}")
        self._formatted = True

    def _make_tls(self) -> Secured:
        from tests.tls_helpers import make_tls

        ca, crt, key = make_tls(self.workdir / "tls")
        # a PEM keystore: the private key (PKCS#8, unencrypted) then the certificate
        keystore = self.workdir / "tls" / "broker.pem"
        keystore.write_bytes(key.read_bytes() + crt.read_bytes())
        self._keystore = keystore
        return Secured(f"{self.host}:{self.sasl_port}", SCRAM_USER, SCRAM_PASSWORD,
                       MECHANISM, ca)

    def _log4j(self) -> Path:
        path = self.workdir / "log4j2.properties"
        if not path.exists():
            path.write_text(
                "status = error\n"
                "appender.out.type = Console\nappender.out.name = out\n"
                "appender.out.layout.type = PatternLayout\n"
                "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
                "rootLogger.level = warn\nrootLogger.appenderRef.out.ref = out\n"
                # the one INFO line worth keeping: when the broker is up
                "logger.server.name = kafka.server.KafkaRaftServer\n"
                "logger.server.level = info\n")
        return path

    def _properties(self) -> Path:
        path = self.workdir / "server.properties"
        if path.exists():
            return path
        ks = self._keystore
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": (f"PLAINTEXT://{self.host}:{self.port},"
                          f"SASL_SSL://{self.host}:{self.sasl_port},"
                          f"CONTROLLER://{self.host}:{self.controller_port}"),
            "advertised.listeners": (f"PLAINTEXT://{self.host}:{self.port},"
                                     f"SASL_SSL://{self.host}:{self.sasl_port}"),
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(ks),
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # a broker killed with SIGKILL may register again once its old session lapses
            # (9 s by default); a single node has nobody to wait for
            "broker.session.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "500",
            # the oversize-record tests send batches of up to 32 MiB
            "message.max.bytes": str(64 << 20),
            "replica.fetch.max.bytes": str(64 << 20),
            # small test topics: fewer threads and smaller preallocated files
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(8 << 20),
            "log.cleaner.backoff.ms": "1000",
            "log.index.size.max.bytes": str(1 << 20),
            "log.segment.bytes": str(64 << 20),
        }
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path
