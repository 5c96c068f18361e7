"""moto's S3 server, with ranged GETs that read only the requested bytes. Benchmark use only.

Stock moto (5.x) answers `Range: bytes=a-b` by reading the *whole* object into memory, copying it,
and slicing: a 64 MiB part of a 1 GiB shard costs 1 GiB of reads and 1 GiB of RAM per request, so
every parallel downloader (ours, awscli, boto3's TransferManager) measures moto's slicing instead of
itself, and 16 concurrent parts of a 5 GiB shard would need 80 GiB of RAM. Real S3 serves a range
in time proportional to the range. This shim gives moto that property and changes nothing else:
listing, ETags, If-Match, errors and full GETs are stock moto. run.py also measures stock moto's
ranged GETs so the difference is on record.

    python moto_ranged_server.py --port 5000
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Iterator

from moto.s3 import models, responses

_request = threading.local()


class _RangeBody:
    """Stands in for the object body: `_handle_range_header` only takes len() and one slice."""

    def __init__(self, key: models.FakeKey) -> None:
        self._key = key

    def __len__(self) -> int:
        return self._key.size

    def __getitem__(self, wanted: slice) -> bytes:
        start, stop, _ = wanted.indices(self._key.size)
        buffer = self._key._value_buffer
        if getattr(buffer, "_rolled", False):
            return os.pread(buffer.fileno(), stop - start, start)  # no shared file offset: no lock
        with self._key.lock:
            buffer.seek(start)
            return buffer.read(stop - start)

    def __iter__(self) -> Iterator[bytes]:  # used only if moto decides to answer without a range
        for offset in range(0, self._key.size, 8 << 20):
            yield self[offset : offset + (8 << 20)]


_stock_value = models.FakeKey.value
_stock_key_response = responses.S3Response.key_response


def _value(self: models.FakeKey):  # type: ignore[no-untyped-def]
    if getattr(_request, "single_range", False):
        _request.single_range = False  # only the body read of this very request
        return _RangeBody(self)
    return _stock_value.fget(self)


def _key_response(self, request, full_url, headers):  # type: ignore[no-untyped-def]
    header = request.headers.get("range", "")
    _request.single_range = request.method == "GET" and header.startswith("bytes=") and "," not in header
    try:
        return _stock_key_response(self, request, full_url, headers)
    finally:
        _request.single_range = False


models.FakeKey.value = property(_value, _stock_value.fset)
responses.S3Response.key_response = _key_response


def main() -> None:
    from moto.server import main as moto_main

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    moto_main(["-H", "127.0.0.1", "-p", str(args.port)])


if __name__ == "__main__":
    main()
