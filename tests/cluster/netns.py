"""A network namespace with only loopback, in which every server and client of a cluster test runs.

An API server dials Service, webhook and pod addresses (10.x) on its own; inside this namespace
those connects fail at once ("Network is unreachable") and nothing leaves the machine. Processes
are started with `ip netns exec`, each in its own session so it is stopped by its process id.
Names a test needs to resolve inside (a rendered Service address) go in the namespace's own hosts
file, `/etc/netns/<name>/hosts`, which `ip netns exec` bind-mounts over /etc/hosts for what it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

STOP_GRACE_SECONDS = 10.0
NETNS_ETC = Path("/etc/netns")


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
