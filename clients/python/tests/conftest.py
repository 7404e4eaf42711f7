"""Fixtures that run a real ``docstream all`` on the local Postgres and Kafka.

Needs ``DATABASE_URL`` and ``DOCSTREAM_KAFKA_BROKERS`` (``eval "$(bash
scripts/services.sh env)"``) and the binary at ``DOCSTREAM_BIN`` (default
``target/debug/docstream`` under the repository). The run gets a database of
its own (made here, dropped at the end), topics under ``pyclient.`` and the
API on ``PYCLIENT_HTTP_ADDR`` (``127.0.0.1:18080``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import docstream

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "samples" / "files"


def _require(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run clients/python/test.sh, or eval \"$(bash scripts/services.sh env)\"", 2)
    return value


class Server:
    """A ``docstream all`` process: started, stopped, killed and started again at will."""

    def __init__(self, binary: Path, env: dict[str, str], work: Path, http_addr: str) -> None:
        self.binary = binary
        self.env = env
        self.work = work
        self.base_url = f"http://{http_addr}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def cli(self, *args: str) -> str:
        """Runs a ``docstream`` command on the run's database; its standard output."""
        done = subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"docstream {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
        return done.stdout.decode()

    def start(self, timeout: float = 90.0) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        log = open(self.work / f"all-{self.starts}.log", "wb")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            [str(self.binary), "all"], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Polls ``/readyz`` until it answers 200 (Postgres and Kafka reachable, not draining)."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"docstream all exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"docstream all not ready after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Sends ``sig`` and waits for the exit (SIGKILL after ``timeout``); the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        path = self.work / f"all-{self.starts}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def panics(self) -> list[str]:
        return [
            line
            for path in sorted(self.work.glob("all-*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if "panicked" in line
        ]


def _psql(admin_url: str, sql: str) -> None:
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", admin_url, "-c", sql], check=True,
                   capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    admin_url = _require("DATABASE_URL")
    brokers = _require("DOCSTREAM_KAFKA_BROKERS")
    binary = Path(os.environ.get("DOCSTREAM_BIN", REPO / "target" / "debug" / "docstream"))
    if not binary.is_absolute():
        binary = REPO / binary
    if not binary.exists():
        pytest.exit(f"no docstream binary at {binary}: build it, or set DOCSTREAM_BIN", 2)
    work = Path(os.environ.get("PYCLIENT_WORK") or tmp_path_factory.mktemp("docstream"))
    work.mkdir(parents=True, exist_ok=True)
    db = f"docstream_pyclient_{os.getpid()}"
    http_addr = os.environ.get("PYCLIENT_HTTP_ADDR", "127.0.0.1:18080")
    env = {
        **os.environ,
        "DATABASE_URL": admin_url.rsplit("/", 1)[0] + "/" + db,
        "DOCSTREAM_KAFKA_BROKERS": brokers,
        "DOCSTREAM_TOPIC_PREFIX": os.environ.get("PYCLIENT_TOPIC_PREFIX", "pyclient."),
        "DOCSTREAM_HTTP_ADDR": http_addr,
        "DOCSTREAM_METRICS_ADDR": os.environ.get("PYCLIENT_METRICS_ADDR", "127.0.0.1:18081"),
        "DOCSTREAM_FILES_DIR": str(work / "files"),
        "DOCSTREAM_LOG": "info,rdkafka=warn,sqlx=warn",
        # The machine may be busy building: do not turn a slow insert into a 503.
        "DOCSTREAM_HTTP_ANSWER_TIMEOUT_S": "5",
    }
    _psql(admin_url, f'CREATE DATABASE "{db}"')
    srv = Server(binary, env, work, http_addr)
    try:
        srv.cli("migrate")
        srv.cli("topics")
        yield srv
    finally:
        srv.stop()
        _psql(admin_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    assert not srv.panics(), "the server panicked:\n" + "\n".join(srv.panics())


@pytest.fixture(scope="session")
def tenant(server: Server) -> str:
    """A tenant of the run's own, with no rate quota."""
    name = f"py{uuid.uuid4().hex[:8]}"
    server.cli("tenants", "create", name)
    server.cli("tenants", "set-quota", name, "--submit-rate-per-s", "0")
    return name


@pytest.fixture(scope="session")
def api_key(server: Server, tenant: str) -> str:
    """A key of the run's tenant, with every scope the client uses."""
    key: str = json.loads(
        server.cli("keys", "create", tenant, "--scopes", "submit,read,cancel,export,delete,review")
    )["api_key"]
    return key


@pytest.fixture(scope="session")
def running(server: Server, api_key: str) -> Server:
    """The server, started (once per session; a test that restarts it leaves it running)."""
    if server.process is None or server.process.poll() is not None:
        server.start()
    return server


@pytest.fixture
def client(running: Server, api_key: str) -> Iterator[docstream.Client]:
    with docstream.Client(running.base_url, api_key=api_key) as c:
        yield c


@pytest.fixture
def run_id() -> str:
    """A value of ``metadata.run`` that only this test's jobs have."""
    return uuid.uuid4().hex


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / f"{name}.json").read_text())
    return data
