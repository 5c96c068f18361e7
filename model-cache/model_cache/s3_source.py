"""S3 (or any S3 API) as the source of record: s3://bucket/prefix + revision -> bucket/prefix/revision/.

Credentials come only from boto3's default chain, which in the cluster is IRSA
(AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE). The endpoint can be overridden with --endpoint-url or
boto3's own AWS_ENDPOINT_URL_S3 (tests point it at a local moto server).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import boto3
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from model_cache.checksums import looks_like_md5_etag
from model_cache.errors import (
    AccessDenied,
    IntegrityError,
    PreloadError,
    SourceNotFound,
    SourceTimeout,
    TransientSourceError,
    UsageError,
)
from model_cache.layout import safe_relative_path
from model_cache.remote import READ_PIECE_BYTES, RemoteFile

_NOT_FOUND_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_DENIED_CODES = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "AccountProblem",
}
_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "500", "503"}
# With SSE-KMS or SSE-C the ETag is not an MD5 of the content, so it proves nothing about our bytes.
_ETAG_NOT_MD5_SSE = {"aws:kms", "aws:kms:dsse"}

_TRANSIENT_EXCEPTIONS = (
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


def parse_s3_uri(uri: str, revision: str) -> tuple[str, str]:
    """s3://bucket/some/prefix + rev -> ("bucket", "some/prefix/rev/")."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise UsageError(f"--source {uri!r} is not an s3://bucket/prefix URI")
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/{revision}/" if prefix else f"{revision}/"


def translate_client_error(error: Exception, what: str) -> PreloadError | TransientSourceError:
    """Map a botocore failure to the exit-code family an operator acts on."""
    if isinstance(error, botocore.exceptions.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        detail = f"{what}: {code or status} {error.response.get('Error', {}).get('Message', '')}".strip()
        if code in _NOT_FOUND_CODES or status == "404":
            return SourceNotFound(f"not found: {detail}")
        if code in _DENIED_CODES or status == "403":
            return AccessDenied(f"access denied: {detail}")
        if code in {"PreconditionFailed", "412"} or status == "412":
            return IntegrityError(f"object changed at the source while downloading: {detail}")
        if code in _RETRYABLE_CODES or status.startswith("5"):
            return TransientSourceError(SourceTimeout(f"source kept failing: {detail}"))
        return PreloadError(f"S3 error: {detail}")
    missing = (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)
    if isinstance(error, missing):
        return AccessDenied(
            f"access denied: no usable AWS credentials for {what} "
            "(in the cluster: IRSA sets AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE)"
        )
    if isinstance(error, botocore.exceptions.CredentialRetrievalError):
        return AccessDenied(f"access denied: could not obtain credentials for {what}: {error}")
    if isinstance(error, _TRANSIENT_EXCEPTIONS):
        return TransientSourceError(SourceTimeout(f"timeout or connection failure on {what}: {error}"))
    return PreloadError(f"unexpected error on {what}: {error!r}")


def permanent(error: PreloadError | TransientSourceError) -> PreloadError:
    """For calls botocore already retried: a still-transient failure is final now."""
    return error.final if isinstance(error, TransientSourceError) else error


class S3Source:
    def __init__(
        self,
        uri: str,
        revision: str,
        *,
        endpoint_url: str | None,
        concurrency: int,
        read_timeout_seconds: float,
        max_attempts: int,
    ) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri, revision)
        self.uri = f"s3://{self.bucket}/{self.prefix}"
        config = Config(
            max_pool_connections=concurrency + 4,
            connect_timeout=min(10.0, read_timeout_seconds),
            read_timeout=read_timeout_seconds,
            retries={"mode": "standard", "max_attempts": max_attempts},
            tcp_keepalive=True,
        )
        # endpoint_url=None lets boto3 apply AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL itself.
        self._client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self._sse_by_key: dict[str, str] = {}
        self._sse_lock = threading.Lock()

    def _key(self, remote: RemoteFile) -> str:
        return self.prefix + remote.path

    def list_files(self) -> list[RemoteFile]:
        files: list[RemoteFile] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for item in page.get("Contents", []):
                    relative = item["Key"][len(self.prefix) :]
                    # Zero-byte "folder" placeholders created by consoles are not files.
                    if relative.endswith("/") and item["Size"] == 0:
                        continue
                    safe_relative_path(relative, self.uri)
                    files.append(
                        RemoteFile(path=relative, size=int(item["Size"]), version_id=item["ETag"].strip('"'))
                    )
        except Exception as error:
            raise permanent(translate_client_error(error, f"listing {self.uri}")) from error
        if not files:
            raise SourceNotFound(f"not found: no objects under {self.uri}")
        return files

    def read_range(self, remote: RemoteFile, start: int, end: int) -> Iterator[bytes]:
        what = f"s3://{self.bucket}/{self._key(remote)} bytes {start}-{end}"
        try:
            response = self._client.get_object(
                Bucket=self.bucket,
                Key=self._key(remote),
                Range=f"bytes={start}-{end}",
                # If the object is replaced mid-download, fail instead of splicing two versions.
                IfMatch=f'"{remote.version_id}"',
            )
            if int(response["ContentLength"]) != end - start + 1:
                raise IntegrityError(
                    f"{what}: server returned {response['ContentLength']} bytes for a "
                    f"{end - start + 1}-byte range"
                )
            self._remember_sse(remote, response)
            yield from response["Body"].iter_chunks(READ_PIECE_BYTES)
        except PreloadError:
            raise
        except Exception as error:
            translated = translate_client_error(error, what)
            raise translated from error

    def _remember_sse(self, remote: RemoteFile, response: dict) -> None:
        sse = response.get("ServerSideEncryption") or ""
        if response.get("SSECustomerAlgorithm"):
            sse = "sse-c"
        with self._sse_lock:
            self._sse_by_key[remote.path] = sse

    def md5_etag(self, remote: RemoteFile) -> str | None:
        if not looks_like_md5_etag(remote.version_id):
            return None
        with self._sse_lock:
            sse = self._sse_by_key.get(remote.path)
        if sse is None:
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self._key(remote))
            except Exception as error:
                what = f"s3://{self.bucket}/{self._key(remote)}"
                raise permanent(translate_client_error(error, what)) from error
            self._remember_sse(remote, head)
            sse = self._sse_by_key[remote.path]
        if sse in _ETAG_NOT_MD5_SSE or sse == "sse-c":
            return None
        return remote.version_id
