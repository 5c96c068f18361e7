"""One downloader per revision, across pods and nodes, on NFS (EFS) where flock is unreliable.

Protocol:
- acquire: create the lock file with O_CREAT|O_EXCL (atomic on NFSv4.1 / EFS) holding a JSON
  state: owner, random token, heartbeat sequence, progress.
- heartbeat: a thread rewrites the state in place every ttl/4 after checking the token is still
  ours; a missing file or another token means the lock was taken over and `lost` is set.
- waiters judge staleness by *observing* the content not change for ttl seconds on their own
  monotonic clock, so clock skew between nodes does not matter. Shortcut: a lock left by an
  earlier run of this same pod (Kubernetes runs one init container attempt at a time), or by a
  dead process on this same host, is stale at once, so a restarted init container does not wait.
- takeover: rename the stale file aside (atomic), and only delete it if it is still exactly the
  stale content that was judged; otherwise it was alive after all and is put back.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from model_cache.errors import LockLost, LockWaitTimeout
from model_cache.jsonlog import log


def default_owner() -> str:
    # In Kubernetes the hostname is the pod name; POD_NAME (downward API) wins when set.
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class LockState:
    owner: str
    token: str
    sequence: int
    heartbeat_at: float
    bytes_done: int = 0
    bytes_total: int = 0
    pod: str = ""
    host: str = ""
    pid: int = 0

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LockState | None:
        try:
            data = json.loads(raw)
            return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None  # torn read of a rewrite in progress: the owner is alive


# Tokens of locks held by this process: our own pid in a lock file means "stale" (a restarted
# container reuses pid numbers) unless the lock is one this very process holds.
_HELD_TOKENS: set[str] = set()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_is_gone(state: LockState | None) -> bool:
    """True only when we can be sure the holder is dead without waiting for its heartbeat to age."""
    if state is None:
        return False
    pod = os.environ.get("POD_NAME", "")
    if pod and state.pod == pod:
        return True  # an earlier attempt of this pod's init container: it is no longer running
    if state.host and state.host == socket.gethostname() and state.pid > 0:
        if state.pid == os.getpid():
            return state.token not in _HELD_TOKENS
        return not _pid_alive(state.pid)
    return False


def read_lock_bytes(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


class RevisionLock:
    def __init__(self, path: Path, ttl_seconds: float, owner: str | None = None) -> None:
        self.path = path
        self.ttl_seconds = ttl_seconds
        self.owner = owner or default_owner()
        self.token = uuid.uuid4().hex
        self.lost = threading.Event()
        self._sequence = 0
        self._progress = (0, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _state(self) -> LockState:
        return LockState(
            self.owner,
            self.token,
            self._sequence,
            time.time(),
            *self._progress,
            pod=os.environ.get("POD_NAME", ""),
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(descriptor, self._state().encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        _HELD_TOKENS.add(self.token)
        self._stop.clear()
        self.lost.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name="lock-heartbeat", daemon=True)
        self._thread.start()
        log("lock_acquired", path=str(self.path), owner=self.owner)
        return True

    def report_progress(self, bytes_done: int, bytes_total: int) -> None:
        self._progress = (bytes_done, bytes_total)

    def _rewrite(self) -> bool:
        """Rewrite our state in place; False if the file is gone or no longer ours."""
        try:
            descriptor = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            current = LockState.decode(os.read(descriptor, 1 << 16))
            if current is None or current.token != self.token:
                return False
            self._sequence += 1
            encoded = self._state().encode()
            os.pwrite(descriptor, encoded, 0)
            os.ftruncate(descriptor, len(encoded))
            os.fsync(descriptor)
            return True
        finally:
            os.close(descriptor)

    def _heartbeat_loop(self) -> None:
        # At most 5 s apart even with a long ttl: the beat also carries progress that waiters log.
        interval = max(min(self.ttl_seconds / 4, 5.0), 0.05)
        while not self._stop.wait(interval):
            try:
                still_ours = self._rewrite()
            except OSError as error:
                # A transient NFS error: keep trying; if it lasts past ttl a waiter takes over and
                # the next successful beat reports the loss.
                log("lock_heartbeat_failed", level="warning", path=str(self.path), error=str(error))
                continue
            if not still_ours:
                log("lock_lost", level="error", path=str(self.path), owner=self.owner)
                self.lost.set()
                return

    def ensure_held(self) -> None:
        current = LockState.decode(read_lock_bytes(self.path) or b"")
        if self.lost.is_set() or current is None or current.token != self.token:
            self.lost.set()
            raise LockLost(f"lock lost: {self.path} was taken over by another preloader (heartbeat stalled)")

    def release(self) -> None:
        _HELD_TOKENS.discard(self.token)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        current = LockState.decode(read_lock_bytes(self.path) or b"")
        if current is not None and current.token == self.token:
            os.unlink(self.path)
            log("lock_released", path=str(self.path))


def _take_over(path: Path, stale: bytes, reason: str) -> bool:
    aside = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True
    moved = aside.read_bytes()
    if moved != stale:
        # It changed between our last read and the rename: alive after all. Put it back unless a
        # new lock already exists (then that owner's heartbeat will notice it lost the race).
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
        os.unlink(aside)
        return False
    os.unlink(aside)
    state = LockState.decode(stale)
    log(
        "lock_taken_over",
        level="warning",
        path=str(path),
        stale_owner=state.owner if state else None,
        reason=reason,
    )
    return True


def wait_for_lock_change(
    path: Path,
    ttl_seconds: float,
    deadline: float,
    on_progress: Callable[[LockState | None, float], None],
    progress_interval_seconds: float,
) -> str:
    """Block until the lock is released ('released') or found stale and removed ('taken_over').

    `deadline` is on the monotonic clock; past it, LockWaitTimeout.
    """
    poll = min(1.0, max(ttl_seconds / 8, 0.05))
    last: bytes | None = None
    unchanged_since = time.monotonic()
    next_report = 0.0
    owner_unreported = False
    while True:
        now = time.monotonic()
        content = read_lock_bytes(path)
        if content is None:
            return "released"
        if content != last:
            last, unchanged_since = content, now
            if owner_is_gone(LockState.decode(content)) and _take_over(path, content, "owner process gone"):
                return "taken_over"
        elif now - unchanged_since > ttl_seconds and _take_over(path, content, "heartbeat stopped"):
            return "taken_over"
        if now >= deadline:
            state = LockState.decode(content)
            raise LockWaitTimeout(
                f"lock wait timeout: {path} still held by {state.owner if state else 'unknown owner'}"
            )
        state = LockState.decode(content)
        # An empty or torn read is the owner between creating the file and writing it (or mid-rewrite):
        # such a report names no owner, so the next readable state is reported at once rather than a
        # whole interval later (a download that ends within the interval would otherwise never name
        # its owner).
        if now >= next_report or (state is not None and owner_unreported):
            on_progress(state, now - unchanged_since)
            next_report = now + progress_interval_seconds
            owner_unreported = state is None
        # An unreadable lock is a moment in its owner's write: read it again soon (for up to one
        # poll interval) so a short hold still names its owner; past that it may be a crashed owner,
        # and the normal poll applies until the ttl judges it stale.
        time.sleep(poll if state is not None or now - unchanged_since >= poll else min(poll, 0.02))
