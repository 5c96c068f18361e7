"""A network namespace with only loopback, in which every server and client of a cluster test runs.

An API server dials Service, webhook and pod addresses (10.x) on its own; inside this namespace
those connects fail at once ("Network is unreachable") and nothing leaves the machine. Processes
are started with `ip netns exec`, each in its own session so it is stopped by its process id.
Names a test needs to resolve inside (a rendered Service address) go in the namespace's own hosts
file, `/etc/netns/<name>/hosts`, which `ip netns exec` bind-mounts over /etc/hosts for what it starts.

Two namespaces may be joined by a veth pair (`join_by_veth`) to stand in for two nodes: each end is
the namespace's `eth0` with an address only the two of them hold, and neither has a default route.
`NetworkNamespace.call` runs a function in a thread that entered the namespace, so the test's own
HTTP clients (and the processes they start) are inside it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

STOP_GRACE_SECONDS = 10.0
NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")
"""Where `ip netns add` keeps the namespace (a bind-mounted nsfs file that setns(2) enters)."""
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


class NetworkNamespace:
    """`ip netns add` on enter (loopback up, no other link), `ip netns del` on exit."""

    def __init__(self, prefix: str = "vp-cluster") -> None:
        self.name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._processes: list[subprocess.Popen] = []

    def __enter__(self) -> NetworkNamespace:
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=30)
        subprocess.run(
            ["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=30
        )
        links = subprocess.run(
            ["ip", "-n", self.name, "-o", "link"], check=True, capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
        # The property every test here relies on: no route off the machine.
        assert len(links) == 1 and ": lo:" in links[0], links
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        shutil.rmtree(NETNS_ETC / self.name, ignore_errors=True)

    def resolve(self, hosts: dict[str, str]) -> None:
        """Make `hosts` (name -> address) resolve for every process started from now on, through the
        namespace's own /etc/hosts (`ip netns exec` bind-mounts `/etc/netns/<name>/hosts` over it);
        removed with the namespace."""
        folder = NETNS_ETC / self.name
        folder.mkdir(parents=True, exist_ok=True)
        lines = [
            "127.0.0.1 localhost",
            "::1 localhost",
            *(f"{address} {name}" for name, address in hosts.items()),
        ]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def call(self, function: Callable[..., T], *args: Any, timeout: float, **kwargs: Any) -> T:
        """`function(*args, **kwargs)` in a new thread that entered this namespace first (setns(2) moves
        only the calling thread; sockets it opens, threads and processes it starts are inside too);
        its result returned, its exception raised here. Bounded by `timeout` seconds."""
        outcome: dict[str, Any] = {}

        def inside() -> None:
            try:
                _enter_network_namespace(NETNS_RUN / self.name)
                outcome["result"] = function(*args, **kwargs)
            except BaseException as error:  # handed to the caller below
                outcome["error"] = error

        thread = threading.Thread(target=inside, name=f"in-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(
                f"{getattr(function, '__name__', function)} ran past {timeout:.0f} s in {self.name}"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        check: bool = True,
        input: str | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside the namespace (bounded by `timeout`)."""
        result = subprocess.run(
            self.command(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            input=input,
            cwd=cwd,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def start(self, argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a long-running server inside the namespace; its output goes to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._processes.append(process)
        return process

    def stop_all(self) -> None:
        """Stop every process started here, newest first: SIGTERM, then SIGKILL after a grace."""
        for process in reversed(self._processes):
            stop_process(process)
        self._processes.clear()


def join_by_veth(
    first: NetworkNamespace,
    second: NetworkNamespace,
    first_address: str,
    second_address: str,
    *,
    prefix_length: int = 30,
    interface: str = "eth0",
) -> None:
    """Link two entered namespaces by a veth pair, each end `interface` in its namespace with its
    address (a pod's eth0 and IP): the only link of either besides loopback. The pair is made inside
    `first`, so it never appears outside the two, and goes with them."""
    steps = [
        [
            "ip",
            "-n",
            first.name,
            "link",
            "add",
            interface,
            "type",
            "veth",
            "peer",
            "name",
            interface,
            "netns",
            second.name,
        ],
        ["ip", "-n", first.name, "addr", "add", f"{first_address}/{prefix_length}", "dev", interface],
        ["ip", "-n", second.name, "addr", "add", f"{second_address}/{prefix_length}", "dev", interface],
        ["ip", "-n", first.name, "link", "set", interface, "up"],
        ["ip", "-n", second.name, "link", "set", interface, "up"],
    ]
    for step in steps:
        subprocess.run(step, check=True, capture_output=True, timeout=30)


TWO_NODE_ADDRESSES = ("192.0.2.1", "192.0.2.2")
"""The two "pods" of `two_nodes` (TEST-NET-1, RFC 5737: documentation only, never routed): only the
two test namespaces hold them, on the two ends of their veth pair."""


@contextlib.contextmanager
def two_nodes(
    prefixes: tuple[str, str] = ("vp-leader", "vp-worker"), *, leader_name: str | None = None
) -> Iterator[tuple[NetworkNamespace, NetworkNamespace]]:
    """Two namespaces joined by a veth pair at TWO_NODE_ADDRESSES, each resolving this machine's host
    name to its own address, as the kubelet writes a pod's /etc/hosts (torch.distributed's gloo binds to
    the address its host name resolves to); and, in both, `leader_name` to the leader's address, as the
    cluster's DNS answers for the name LWS gives a group's leader."""
    leader_address, worker_address = TWO_NODE_ADDRESSES
    shared = {leader_name: leader_address} if leader_name else {}
    with NetworkNamespace(prefixes[0]) as leader, NetworkNamespace(prefixes[1]) as worker:
        join_by_veth(leader, worker, leader_address, worker_address)
        leader.resolve({socket.gethostname(): leader_address, **shared})
        worker.resolve({socket.gethostname(): worker_address, **shared})
        yield leader, worker


def _enter_network_namespace(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(descriptor, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({path}): {os.strerror(error)}")
    finally:
        os.close(descriptor)


def stop_process(process: subprocess.Popen, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace_seconds)
