"""The test harness: real ``musterd`` processes on loopback, as ``tests/src/lib.rs`` runs them.

``daemon`` starts ``musterd`` with a fresh data directory on a loopback port below the
kernel's ephemeral range (:func:`free_port_below_ephemeral`: no client's port-0 socket can
take it while the daemon is down for a restart) and waits for its JSON log to say it
listens. The binaries are ``target/debug/musterd`` and
``target/debug/muster`` (``CARGO_TARGET_DIR`` honoured, or ``MUSTER_BIN_DIR``), built
with cargo when missing. Every wait here is bounded; only processes a test started are
signalled.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, Dict, List, Optional, Sequence, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

START_TIMEOUT = 60.0
"""Longest a daemon may take to report that it listens."""

TEST_TIMEOUT = 60.0
"""Longest one test's asyncio body may run (see :func:`run`)."""

_T = TypeVar("_T")

PORTS_FROM = 10_000
"""The lowest port the harness chooses for a daemon."""

_next_port: Optional[int] = None


def free_port_below_ephemeral() -> int:
    """A free loopback UDP port below the kernel's ephemeral range, as
    ``tests/src/lib.rs`` chooses one: every bind to port 0 draws from that range, so none
    can take a stopped daemon's port before it is restarted on it. Ports are handed out in
    turn from a random start, so one test run does not choose the same port twice."""
    global _next_port
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            end = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        end = 32_768
    if end <= PORTS_FROM + 1_000:
        end = 32_768
    span = end - PORTS_FROM
    port = (
        _next_port
        if _next_port is not None
        else PORTS_FROM + int.from_bytes(os.urandom(2), "big") % span
    )
    for _ in range(span):
        port = PORTS_FROM if port + 1 >= end else port + 1
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port = port
        return port
    raise AssertionError(f"no free UDP port on 127.0.0.1 between {PORTS_FROM} and {end}")


def bin_dir() -> Path:
    """Where the muster binaries are, built first if missing."""
    explicit = os.environ.get("MUSTER_BIN_DIR")
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    built = target / "debug"
    if not (built / "musterd").exists() or not (built / "muster").exists():
        subprocess.run(
            ["cargo", "build", "-p", "muster-daemon", "-p", "muster-tui", "--bins"],
            cwd=REPO,
            check=True,
            timeout=1800,
        )
    return built


def run(body: Coroutine[Any, Any, _T], timeout: float = TEST_TIMEOUT) -> _T:
    """Runs a test's asyncio body on a fresh loop, failing it after ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(body, timeout))


class Daemon:
    """A running ``musterd`` with its data directory."""

    def __init__(self, bins: Path, data: Path, args: Sequence[str] = ()) -> None:
        self.bins = bins
        self.data = data
        self.args = list(args)
        self.addr = f"127.0.0.1:{free_port_below_ephemeral()}"
        self.cluster_addr = ""
        """A cluster node's node-to-node address, as it reported it (else empty)."""
        self.fingerprint = ""
        self.proc: Optional[subprocess.Popen[str]] = None
        self.start()

    def start(self) -> None:
        """Starts the daemon (again, on the same port and data directory)."""
        assert self.proc is None, "stop the daemon before starting it again"
        log = open(self.data / "musterd.log", "a")
        self.proc = subprocess.Popen(
            [
                str(self.bins / "musterd"),
                "--data",
                str(self.data),
                "--listen",
                self.addr,
                "--log-format",
                "json",
                *self.args,
            ],
            # The disk alarm off: the test machine's free space is not the test's business.
            env={
                **os.environ,
                "MUSTER_LOG": "info",
                "MUSTER_DISK_ALARM_FREE_MIB": "0",
                "MUSTER_DISK_ALARM_FREE_PERCENT": "0",
            },
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        stderr = self.proc.stderr
        assert stderr is not None

        def copy() -> None:
            # Keeps draining the log, so the daemon never blocks on a full pipe.
            with log:
                for line in stderr:
                    log.write(line)
                    log.flush()
                    lines.put(line)

        threading.Thread(target=copy, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"musterd did not report listening within {START_TIMEOUT}s; log in {self.data}"
                ) from None
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:
                continue
            if str(fields.get("message", "")).startswith("musterd listening"):
                self.addr = fields["addr"]
                self.cluster_addr = fields.get("cluster_addr", "")
                self.fingerprint = fields["fingerprint"]
                return

    @property
    def connect(self) -> Dict[str, Any]:
        """Keyword arguments of ``Client.connect`` and ``Worker`` for this daemon."""
        return {"addr": self.addr, "data": str(self.data)}

    def env(self) -> Dict[str, str]:
        """The environment of a program that connects to this daemon."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        env.update(MUSTER_ADDR=self.addr, MUSTER_DATA=str(self.data), PYTHONUNBUFFERED="1")
        return env

    def kill9(self) -> None:
        """SIGKILL, and waits for the daemon to be gone."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM, and waits (SIGKILL after 30 s)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Runs the ``muster`` CLI against this daemon."""
        return subprocess.run(
            [str(self.bins / "muster"), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )


CLUSTER_ID = "py-test"
"""The cluster id of the test clusters."""

IDENTITY_FILES = ("cert.pem", "key.pem")
"""What every node of a cluster shares with node 1: its TLS certificate and key, so one
trust (node 1's data directory) works for all."""


def cluster_secret(directory: Path) -> Path:
    """A fresh cluster secret (48 random bytes, hex) in a file only this user reads."""
    path = directory / "cluster.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(48).hex() + "\n")
    return path


def cluster_node(
    bins: Path,
    data: Path,
    node: int,
    secret: Path,
    args: Sequence[str] = (),
    identity_from: Optional[Path] = None,
) -> Daemon:
    """Starts cluster node ``node`` on loopback (its client port chosen as any
    daemon's, its node-to-node port by the system, read back from its log), as
    ``tests/src/cluster.rs`` starts one: node 1 with ``--bootstrap`` (a one-node
    cluster), any other with node 1's identity (``identity_from``, its data directory)
    copied in before its first start, to be added with ``cluster_add``."""
    data.mkdir(mode=0o700, exist_ok=True)
    if identity_from is not None:
        for name in IDENTITY_FILES:
            shutil.copy2(identity_from / name, data / name)
    flags = [
        "--cluster-id",
        CLUSTER_ID,
        "--node-id",
        str(node),
        "--cluster-listen",
        "127.0.0.1:0",
        "--cluster-secret-file",
        str(secret),
        *args,
    ]
    if identity_from is None:
        flags.append("--bootstrap")
    return Daemon(bins, data, flags)


class Relay:
    """A UDP relay between clients and a daemon that can cut them apart (every datagram
    dropped), as ``tests/src/relay.rs`` is for the Rust tests. Clients connect to
    ``addr``; one thread copies datagrams both ways, each client through a socket of
    its own toward the daemon."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._front.bind(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._front.getsockname()[1]}"
        self.cut = False
        """True while partitioned."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._front, selectors.EVENT_READ)
        backs: Dict[Any, socket.socket] = {}
        clients: Dict[socket.socket, Any] = {}
        while not self._stopped.is_set():
            for key, _ in selector.select(timeout=0.05):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data, source = sock.recvfrom(65536)
                    if self.cut:
                        continue
                    if sock is self._front:
                        back = backs.get(source)
                        if back is None:
                            back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                            back.connect(self._upstream)
                            selector.register(back, selectors.EVENT_READ)
                            backs[source], clients[back] = back, source
                        back.send(data)
                    else:
                        self._front.sendto(data, clients[sock])
                except OSError:
                    continue  # e.g. the daemon's port refused a datagram: UDP loses it
        for sock in [self._front, *backs.values()]:
            sock.close()

    def close(self) -> None:
        """Stops the relay."""
        self._stopped.set()
        self._thread.join(timeout=10)


class Program:
    """A Python program a test started in a process group of its own, with its stdout
    lines (each with the monotonic time it was read)."""

    def __init__(self, args: Sequence[str], env: Dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                self.lines.put((time.monotonic(), line.rstrip("\n")))

        threading.Thread(target=read, daemon=True).start()

    def lines_matching(
        self, n: int, timeout: float, pred: Callable[[str], bool]
    ) -> List[tuple[float, str]]:
        """The next ``n`` stdout lines matching ``pred`` with their times; fails after
        ``timeout`` seconds."""
        found: List[tuple[float, str]] = []
        deadline = time.monotonic() + timeout
        while len(found) < n:
            try:
                at, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"only {len(found)} of {n} expected lines within {timeout}s: {found}"
                ) from None
            if pred(line):
                found.append((at, line))
        return found

    def signal(self, sig: int) -> None:
        """Signals the program's process group."""
        os.killpg(self.proc.pid, sig)

    def kill9(self) -> None:
        """kill -9 of the program's process group, and waits for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        """Waits for the program to exit; returns its status."""
        return self.proc.wait(timeout=timeout)


CONNECTION_VARIABLES = (
    "MUSTER_CONTEXT",
    "MUSTER_ADDR",
    "MUSTER_DATA",
    "MUSTER_CA",
    "MUSTER_PIN",
    "MUSTER_TOKEN",
    "MUSTER_TOKEN_FILE",
)
"""The variables the client settles its connection from (besides the contexts file)."""


@pytest.fixture(autouse=True)
def private_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A configuration directory of the test's own (``XDG_CONFIG_HOME``), so the user's
    ``muster/contexts.toml`` never decides where a test connects, and none of the
    user's connection variables."""
    config = tmp_path_factory.mktemp("config")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    for name in CONNECTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return config


@pytest.fixture(scope="session")
def bins() -> Path:
    """The directory of ``musterd`` and ``muster``."""
    return bin_dir()


@pytest.fixture
def daemon(bins: Path, tmp_path: Path) -> Any:
    """A fresh daemon, stopped after the test."""
    d = Daemon(bins, tmp_path)
    yield d
    d.stop()


@pytest.fixture
def programs() -> Any:
    """Starts Python programs; kills whatever is left of them after the test."""
    started: List[Program] = []

    def start(args: Sequence[str], env: Dict[str, str]) -> Program:
        program = Program(args, env)
        started.append(program)
        return program

    yield start
    for program in started:
        program.kill9()
