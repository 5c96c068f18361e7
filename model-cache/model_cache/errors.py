"""Exit codes and the exceptions that carry them.

Every failure the preloader expects ends as one `PreloadError` whose exit code tells Kubernetes
(and the person reading `kubectl describe pod`) what went wrong without reading a traceback.
The table is documented in README.md; keep both in step.
"""

from __future__ import annotations

import errno
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    SOURCE_NOT_FOUND = 3
    ACCESS_DENIED = 4
    DISK_FULL = 5
    TIMEOUT = 6
    LOCK_WAIT_TIMEOUT = 7
    INTEGRITY = 8
    LOCK_LOST = 9


class PreloadError(Exception):
    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(PreloadError):
    exit_code = ExitCode.USAGE


class SourceNotFound(PreloadError):
    exit_code = ExitCode.SOURCE_NOT_FOUND


class AccessDenied(PreloadError):
    exit_code = ExitCode.ACCESS_DENIED


class DiskFull(PreloadError):
    exit_code = ExitCode.DISK_FULL


class SourceTimeout(PreloadError):
    exit_code = ExitCode.TIMEOUT


class LockWaitTimeout(PreloadError):
    exit_code = ExitCode.LOCK_WAIT_TIMEOUT


class IntegrityError(PreloadError):
    exit_code = ExitCode.INTEGRITY


class LockLost(PreloadError):
    exit_code = ExitCode.LOCK_LOST


class TransientSourceError(Exception):
    """A read that may succeed if retried (connection reset, read timeout, throttling).

    `final` is the error to raise once retries are exhausted.
    """

    def __init__(self, final: PreloadError) -> None:
        super().__init__(final.message)
        self.final = final


# EFBIG: a file-size limit (RLIMIT_FSIZE, or the filesystem's own) reads the same to an operator as
# a full disk: the destination cannot hold the model.
_OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def is_out_of_space(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _OUT_OF_SPACE_ERRNOS
