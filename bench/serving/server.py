"""Start, watch and stop one vLLM server process group; sample GPU memory (stdlib only).

Every server runs in its own session (`setsid`, via start_new_session) so stopping it kills the
API server, the engine core and any compile workers together. Process-group ids are also written
to a registry file that gpu_phase.sh reads on exit, so no server outlives a phase even when the
Python process itself is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.serving.vllm_log import KV_CACHE_KEYS, kv_cache_ready, parse_line

WORK_DIR = Path(os.environ.get("BENCH_WORK_DIR", "/tmp/bench-serving"))
REGISTRY = WORK_DIR / "process-groups"


class ServerFailedError(RuntimeError):
    """The server exited or missed its deadline; the message ends with its log tail."""


def _register(pgid: int) -> None:
    REGISTRY.parent.mkdir(parents=True, exist_ok=True)
    with REGISTRY.open("a") as registry:
        registry.write(f"{pgid}\n")


def _unregister(pgid: int) -> None:
    if not REGISTRY.exists():
        return
    remaining = [line for line in REGISTRY.read_text().split() if line != str(pgid)]
    REGISTRY.write_text("".join(f"{line}\n" for line in remaining))


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: an exited child stays in
    its group until reaped, and PID 1 of a container may never reap orphans."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: fall back to the signal probe
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def kill_group(pgid: int, grace_s: float, leader: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the group, wait up to `grace_s` for all of it to exit, then SIGKILL whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline:
        if leader is not None:
            leader.poll()  # reap our own child so that it stops counting
        if not group_alive(pgid):
            return
        time.sleep(0.25)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def kill_registered(grace_s: float = 10) -> list[int]:
    """Stop every process group a phase started and did not stop (cleanup after a crash)."""
    if not REGISTRY.exists():
        return []
    groups = [int(line) for line in REGISTRY.read_text().split() if line.strip()]
    for pgid in groups:
        kill_group(pgid, grace_s)
        _unregister(pgid)
    return groups


@dataclass
class ServerStart:
    """What one start of a server showed: milestones (seconds since launch) and log facts."""

    name: str
    command: list[str]
    launched_at: float
    ready_s: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    milestones_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "launched_at": self.launched_at,
            "ready_s": self.ready_s,
            "milestones_s": self.milestones_s,
            "facts": self.facts,
            "error": self.error,
        }


class VllmServer:
    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        port: int,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.command = list(command)
        self.env = dict(env)
        self.log_path = log_path
        self.port = port
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None
        self.start_record: ServerStart | None = None
        self._log_offset = 0
        self._partial = b""

    def start(self) -> ServerStart:
        if port_in_use(self.host, self.port):
            # Another server would answer our /health and our requests: measurements of the wrong server.
            raise ServerFailedError(
                f"{self.name}: port {self.port} is already in use; stop whatever listens there"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        _register(self.process.pid)
        self.start_record = ServerStart(self.name, self.command, launched_at=time.time())
        return self.start_record

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _read_new_log(self) -> None:
        """Stamp each new log line with the time it was first seen (vLLM's own stamps are 1 s)."""
        record = self.start_record
        assert record is not None
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            data = log.read()
        self._log_offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        elapsed = round(time.time() - record.launched_at, 1)
        for raw in lines:
            text = raw.decode(errors="replace")
            found = parse_line(text)
            if any(key in found and key not in record.facts for key in KV_CACHE_KEYS):
                record.facts.setdefault("kv_cache_log_lines", []).append(text)
            for key, value in found.items():
                if key not in record.facts:
                    record.facts[key] = value
                    record.milestones_s.setdefault(key, elapsed)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(
        self, *, until: str, timeout_s: float, on_progress: Callable[[str], None] | None = None
    ) -> ServerStart:
        """Block until `/health` answers (until="health") or the KV-cache lines appeared ("kv")."""
        record = self.start_record
        assert record is not None and self.process is not None
        deadline = record.launched_at + timeout_s
        reported: set[str] = set()
        while True:
            self._read_new_log()
            for key in record.milestones_s:
                if key not in reported and on_progress is not None:
                    on_progress(
                        f"{self.name}: {key} = {record.facts.get(key)} at {record.milestones_s[key]} s"
                    )
                reported.add(key)
            if until == "kv" and kv_cache_ready(record.facts):
                record.ready_s = record.milestones_s.get("max_concurrency")
                return record
            if until == "health" and self.healthy():
                record.ready_s = round(time.time() - record.launched_at, 2)
                record.milestones_s["health"] = record.ready_s
                return record
            if self.process.poll() is not None:
                record.error = f"exited with code {self.process.returncode} before {until}"
                raise ServerFailedError(f"{self.name} {record.error}\n{self.log_tail()}")
            if time.time() > deadline:
                record.error = f"no {until} within {timeout_s:.0f} s"
                raise ServerFailedError(f"{self.name}: {record.error}\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 30) -> float:
        """Stop the whole process group; returns the seconds it took."""
        if self.process is None:
            return 0.0
        began = time.time()
        kill_group(self.process.pid, grace_s, leader=self.process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        _unregister(self.process.pid)
        return round(time.time() - began, 2)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, port)) == 0


def cpu_facts() -> dict[str, Any]:
    """What else competes for the CPUs: vLLM's start and Transformers' eager decode are CPU-bound.

    The load average is the whole host's; BENCH_OTHER_LANE is what bench/lab_session.sh runs beside
    this process on the other GPU at the same time (absent when nothing does)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except OSError:
        load = None
    return {
        "host_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "load_average_1_5_15m": load,
        "other_lane": os.environ.get("BENCH_OTHER_LANE") or None,
    }


def nvidia_smi(query: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi --query-...`; None where there is no nvidia-smi (CPU dry runs)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        output = subprocess.run(
            ["nvidia-smi", *query.split(), "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [
        [cell.strip() for cell in line.split(",")] for line in output.strip().splitlines() if line.strip()
    ]


def gpu_memory_mib() -> tuple[int, int] | None:
    """(used, total) MiB of GPU 0."""
    rows = nvidia_smi("--query-gpu=memory.used,memory.total")
    if not rows:
        return None
    return int(float(rows[0][0])), int(float(rows[0][1]))


def wait_gpu_free(timeout_s: float, max_used_fraction: float = 0.05) -> dict[str, Any]:
    """Wait until GPU 0 is (nearly) empty: vLLM refuses to start below util x total free memory."""
    began = time.time()
    while True:
        memory = gpu_memory_mib()
        if memory is None:
            return {"checked": False}
        used, total = memory
        if used <= total * max_used_fraction:
            return {
                "checked": True,
                "used_mib": used,
                "total_mib": total,
                "waited_s": round(time.time() - began, 1),
            }
        if time.time() - began > timeout_s:
            apps = nvidia_smi("--query-compute-apps=pid,used_memory")
            raise ServerFailedError(
                f"GPU still holds {used} of {total} MiB after {timeout_s:.0f} s; processes: {apps}"
            )
        time.sleep(1)


class GpuSampler:
    """Background nvidia-smi sampling (memory used, utilisation) once a second."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, int, int]] = []  # (time, used MiB, util %)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=20)

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = nvidia_smi("--query-gpu=memory.used,utilization.gpu")
            if rows:
                self.samples.append((time.time(), int(float(rows[0][0])), int(float(rows[0][1]))))
            self._stop.wait(self.period_s)

    def window(self, begin: float, end: float) -> dict[str, Any]:
        inside = [sample for sample in self.samples if begin <= sample[0] <= end]
        if not inside:
            return {"samples": 0}
        return {
            "samples": len(inside),
            "peak_memory_used_mib": max(s[1] for s in inside),
            "mean_gpu_util_pct": round(sum(s[2] for s in inside) / len(inside), 1),
        }
