"""basic_auth_users of the web config under attack: a flood of wrong passwords leaves
scrapes and ingest alone (bcrypt serialised, results remembered), and a 401 takes as
long for an unknown user as for a known one (calmon.io.basic_auth)."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io import webconfig
from calmon.io.exposition import new_registry
from calmon.io.http import HttpServer
from tests.daemon_helpers import subprocess_env, wait_until
from tests.tls_helpers import https_get, serving, web_config

ATTACKERS = 40
SCRAPE_EVERY_S = 0.5


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# ---------------------------------------------------------------- 8: timing


def test_a_401_takes_as_long_for_an_unknown_user_as_for_a_known_one(tmp_path: Path) -> None:
    web = web_config(tmp_path, {"prometheus": "s3cret-pass"}, rounds=10)  # htpasswd's cost
    ca = tmp_path / "ca.crt"
    with serving(web) as server:
        times: dict[str, list[float]] = {"prometheus": [], "nobody": []}
        for i in range(15):  # interleaved, so a noisy neighbour slows both alike
            for user, took in times.items():
                t = time.perf_counter()
                code, _ = https_get(server.port, "/metrics", ca,
                                    authorization=basic(user, f"guess-{i}"))
                took.append(time.perf_counter() - t)
                assert code == 401
        known, unknown = statistics.median(times["prometheus"]), statistics.median(
            times["nobody"])
        print(f"median 401: known user {known * 1000:.1f} ms, unknown {unknown * 1000:.1f} ms")
        assert abs(known - unknown) <= 0.020 or (
            max(known, unknown) <= 5 * min(known, unknown)), (known, unknown)
        code, body = https_get(server.port, "/metrics", ca,
                               authorization=basic("prometheus", "s3cret-pass"))
        assert code == 200 and b"calmon_test_total" in body


def test_unknown_users_are_checked_against_a_dummy_hash_of_the_users_cost() -> None:
    import bcrypt

    from calmon.io.basic_auth import DUMMY_HASH, BasicAuth

    assert bcrypt.checkpw(b"fakepassword", DUMMY_HASH)  # exporter-toolkit's, cost 10
    cost10 = BasicAuth({"a": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=10))})
    assert cost10.dummy == DUMMY_HASH
    cost5 = BasicAuth({"a": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)),
                       "b": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=5))})
    assert cost5.dummy[4:7] == b"05$"  # the slowest user's cost
    attempt = cost5.attempt(basic("nobody", "fakepassword"))
    assert attempt is not None and not attempt.known
    assert cost5.verify(attempt) is False and cost5.checks == 1  # refused after a bcrypt
    assert cost5.cached(attempt) is False and cost5.check(basic("nobody", "fakepassword")) is False
    assert cost5.checks == 1  # remembered
    assert cost5.check(basic("a", "pw")) and cost5.check(basic("a", "pw"))
    assert cost5.checks == 2
    for bad in (None, "Bearer x", "Basic !!", "Basic " + base64.b64encode(b"no-colon").decode()):
        assert cost5.attempt(bad) is None
    # bcrypt reads 72 bytes, as Go's CompareHashAndPassword and htpasswd
    long = "p" * 80
    auth = BasicAuth({"a": bcrypt.hashpw(long[:72].encode(), bcrypt.gensalt(rounds=4))})
    assert auth.check(basic("a", long))


def test_a_client_that_hangs_up_costs_no_bcrypt(tmp_path: Path) -> None:
    web = webconfig.load(web_config(tmp_path, {"prometheus": "s3cret-pass"}))
    assert web is not None and web.auth is not None
    auth = web.auth
    with HttpServer("127.0.0.1", 0, new_registry(), lambda: True, lambda: {},
                    web=web) as server:
        ca = tmp_path / "ca.crt"
        ctx = ssl.create_default_context(cafile=str(ca))
        clients = []
        with auth._bcrypt:  # the checks wait: every request below queues behind the first
            for i in range(20):
                raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: "
                            + basic("prometheus", f"guess-{i}").encode() + b"\r\n\r\n")
                clients.append(tls)
            wait_until(lambda: server.passwords_waiting >= 19, 30, "the requests queued")
            for tls in clients:  # every client gives up waiting
                tls.close()
        wait_until(lambda: server.passwords_waiting == 0, 30, "the queue drained")
        assert auth.checks <= 1  # the one taken before its client hung up, at most
        assert https_get(server.port, "/metrics", ca,
                         authorization=basic("prometheus", "s3cret-pass"))[0] == 200
        assert auth.checks <= 2


# ---------------------------------------------------------------- 7: the flood

CYCLES = 6  # calm and flooded spans alternate, so a noisy neighbour weighs on both alike
SPAN_S = 2.0

# 40 threads, each sending one wrong password after the other while "on"; "off" cuts
# every connection in flight (the requests the server still holds are then dead)
ATTACK = """
import base64, http.client, json, socket, ssl, sys, threading
port, ca, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
on, done = threading.Event(), threading.Event()
codes, live, lock = {}, set(), threading.Lock()

def attack(k):
    ctx = ssl.create_default_context(cafile=ca)
    i = 0
    while not done.is_set():
        if not on.wait(0.1):
            continue
        i += 1
        token = base64.b64encode(f"prometheus:wrong-{k}-{i}".encode()).decode()
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
        try:
            conn.connect()
            with lock:
                live.add(conn.sock)
            conn.request("GET", "/metrics", headers={"Authorization": "Basic " + token})
            code = str(conn.getresponse().status)
        except OSError:
            code = "cut"
        finally:
            with lock:
                live.discard(conn.sock)
            conn.close()
        with lock:
            codes[code] = codes.get(code, 0) + 1

threads = [threading.Thread(target=attack, args=(k,), daemon=True) for k in range(n)]
for t in threads:
    t.start()
for line in sys.stdin:
    if line.strip() == "on":
        on.set()
    else:
        on.clear()
        with lock:
            for s in list(live):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    print("ok", flush=True)
done.set()
for t in threads:
    t.join(60)
print(json.dumps(codes), flush=True)
"""


def stream(n: int) -> list[Raw]:
    """n predictions of one model, each labelled 100 records later."""
    out: list[Raw] = []
    for i in range(n):
        p = (i * 7919 % 1000) / 1000
        out.append(Raw(Kind.PREDICTION, json.dumps(
            {"id": f"r{i}", "model": "ctr", "ts": 1_700_000_000 + i / 100, "prob": p}).encode()))
        if i >= 100:
            out.append(Raw(Kind.LABEL, json.dumps(
                {"id": f"r{i - 100}", "label": int((i - 100) % 3 == 0)}).encode()))
    return out


class Ingest:
    """The join loop's work in this process: an engine fed batches as fast as it
    takes them, noting the time and the samples joined after each batch."""

    def __init__(self) -> None:
        self.records = stream(20_000)
        self.marks: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)

    def _run(self) -> None:
        total = 0
        while not self.stop.is_set():
            engine = Engine(Config())
            for i in range(0, len(self.records), 1000):
                engine.feed(self.records[i:i + 1000])
                self.marks.append((time.monotonic(), total + engine.counters["joined"]))
                if self.stop.is_set():
                    return
            total += engine.counters["joined"]

    def joined(self, t0: float, t1: float) -> float:
        """Samples joined from t0 to t1 (interpolated between the batches' marks)."""
        times = [t for t, _ in self.marks]
        joined = [j for _, j in self.marks]
        assert times and times[0] <= t0 and times[-1] >= t1, "ingest made no progress"
        return float(np.interp(t1, times, joined) - np.interp(t0, times, joined))


def scrape_for(seconds: float, port: int, ca: Path, auth: str) -> list[int]:
    """A valid scrape every SCRAPE_EVERY_S for ``seconds``: their statuses."""
    codes = []
    start = time.monotonic()
    for k in range(round(seconds / SCRAPE_EVERY_S)):
        codes.append(https_get(port, "/metrics", ca, authorization=auth, timeout=10)[0])
        time.sleep(max(0.0, start + (k + 1) * SCRAPE_EVERY_S - time.monotonic()))  # pacing
    return codes


@pytest.mark.slow  # ~35 s: six calm and six flooded spans of 2 s, and the attack's start
def test_a_wrong_password_flood_leaves_scrapes_and_ingest_alone(tmp_path: Path) -> None:
    web = web_config(tmp_path, {"prometheus": "s3cret-pass"}, rounds=10)  # htpasswd's cost
    ca, auth = tmp_path / "ca.crt", basic("prometheus", "s3cret-pass")
    loaded = webconfig.load(web)
    assert loaded is not None and loaded.auth is not None
    ingest = Ingest()
    spans: dict[str, list[tuple[float, float]]] = {"calm": [], "flood": []}
    scrapes: dict[str, list[int]] = {"calm": [], "flood": []}
    with HttpServer("127.0.0.1", 0, new_registry(), lambda: True, lambda: {},
                    web=loaded) as server:
        # Prometheus has scraped before: its credentials were checked once
        assert https_get(server.port, "/metrics", ca, authorization=auth)[0] == 200
        attackers = subprocess.Popen(
            [sys.executable, "-c", ATTACK, str(server.port), str(ca), str(ATTACKERS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=subprocess_env())
        assert attackers.stdin is not None and attackers.stdout is not None

        def tell(what: str) -> None:
            attackers.stdin.write(what + "\n")  # type: ignore[union-attr]
            attackers.stdin.flush()  # type: ignore[union-attr]
            assert attackers.stdout.readline() == "ok\n"  # type: ignore[union-attr]

        ingest.thread.start()
        wait_until(lambda: ingest.marks, 60, "ingest under way")
        checks = loaded.auth.checks
        try:
            for _ in range(CYCLES):
                for phase in ("calm", "flood"):
                    if phase == "flood":
                        tell("on")  # every attacker's request waits for its bcrypt
                        wait_until(lambda: server.passwords_waiting >= ATTACKERS - 5, 60,
                                   "the attackers' requests queued")
                    t = time.monotonic()
                    scrapes[phase] += scrape_for(SPAN_S, server.port, ca, auth)
                    spans[phase].append((t, time.monotonic()))
                    if phase == "flood":
                        tell("off")
        finally:
            ingest.stop.set()
            out, _ = attackers.communicate(input="", timeout=120)
            ingest.thread.join(60)
        checked, refused = loaded.auth.checks - checks, server.refused
    codes = json.loads(out.strip().splitlines()[-1])
    rate = {phase: sum(ingest.joined(a, b) for a, b in spans[phase])
            / sum(b - a for a, b in spans[phase]) for phase in spans}
    ratio = rate["flood"] / rate["calm"]
    share = scrapes["flood"].count(200) / len(scrapes["flood"])
    print(f"valid scrapes answered 200 under {ATTACKERS} wrong-password connections: "
          f"{share:.0%} of {len(scrapes['flood'])}; ingest {rate['flood']:,.0f}/s vs "
          f"{rate['calm']:,.0f}/s without ({ratio:.2f}x); {checked} passwords checked, "
          f"{refused} refused; the attackers got {codes}")
    # the flood was real: the attackers sent, the server checked and answered 401 (on a
    # busy machine the lowest-priority bcrypt thread may answer after "off" cut the
    # connection: the attacker then records "cut", the server's count still says 401)
    assert sum(codes.values()) > 0 and checked > 0 and refused > 0
    assert "200" not in codes, codes  # a wrong password never gets in
    assert scrapes["calm"].count(200) == len(scrapes["calm"]), scrapes["calm"]
    assert share >= 0.9, scrapes["flood"]
    assert ratio >= 0.8, rate
