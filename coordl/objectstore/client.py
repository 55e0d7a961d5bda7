"""One bucket prefix read through boto3: GET, ranged GET and LIST, with retries, clear errors and counters.

Why boto3 (measured, see reports/bench_objectstore.md): on 110 kB objects from a local S3 server, the client
process spent 1.0 ms of CPU per GET with boto3, 2.3 ms with s3fs (fsspec) and 0.37 ms with obstore. obstore is
the fastest and lightest (16 MB, no dependencies), but its Rust runtime hangs a forked child once the parent
has used it, and torch's DataLoader forks its workers after the dataset listed the bucket. boto3 (35 MB
installed, against s3fs's 42 MB) is thread-safe, fork-safe with one client per process, and reads every
standard credential place (see :mod:`coordl.objectstore.options`).

Each HTTP attempt is one request in :meth:`stats` (``store_requests``); ``store_bytes`` counts payload bytes
received, ``store_retries`` the attempts that failed and were retried. Failures:

* a missing key: ``FileNotFoundError`` naming the ``s3://`` URL, at once (no retry);
* refused credentials: ``PermissionError`` naming the URL, the endpoint and where the credentials came
  from, at once (retrying cannot fix them);
* a dead, throttling or failing server (connection errors, timeouts, 5xx, SlowDown, short bodies): retried
  with exponential backoff and jitter; after ``attempts`` tries a :class:`StoreUnavailableError` naming the
  key, the endpoint, the attempts and the time spent. Nothing is returned half-read, so no cache above
  ever stores a partial object.
"""

from __future__ import annotations

import operator
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordl.errors import CoordlError
from coordl.objectstore.options import S3Url, client_settings, parse_s3_url
from shmem.forklock import ForkSafeLock

__all__ = ["ObjectStore", "ObjectInfo", "StoreUnavailableError", "STORE_COUNTERS"]

STORE_COUNTERS = ("store_requests", "store_bytes", "store_retries")
_MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "InvalidToken",
           "ExpiredToken", "AuthorizationHeaderMalformed", "InvalidClientTokenId"}  # fmt: skip
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                "ServiceUnavailable", "RequestTimeTooSkewed", "503", "500", "502", "504"}  # fmt: skip

_client_lock = ForkSafeLock()  # a lock copied by fork may be held by a parent's thread


class StoreUnavailableError(CoordlError, ConnectionError):
    """The object store did not answer (or kept failing) for one key after every retry."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing: key (full), size in bytes, last-modified (ns since the epoch), ETag."""

    key: str
    size: int
    mtime_ns: int
    etag: str


class ObjectStore:
    """The objects under ``s3://bucket/prefix``, read with one boto3 client per process (thread-safe).

    Args:
        url: ``s3://bucket[/prefix]``.
        storage_options: endpoint and credentials (see :func:`coordl.objectstore.options.client_settings`);
            None: the environment and the AWS config files decide.
        attempts: tries per request before a dead or failing server is an error (connection errors, timeouts,
            5xx and SlowDown are retried; a missing key or refused credentials never are).
        backoff_s: the first retry's wait; it doubles each retry (with jitter), up to ``max_backoff_s``.
        connect_timeout_s, read_timeout_s: per attempt.
        max_connections: HTTP connections kept per process (fetch-ahead threads share them).
        counters: a ``SharedCounters`` with :data:`STORE_COUNTERS` (None: this store makes its own), so
            requests made by forked DataLoader workers add up in :meth:`stats`.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        attempts: int = 5,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 32,
        counters: Any = None,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"ObjectStore: attempts must be at least 1, got {attempts}")
        self.location: S3Url = parse_s3_url(url)
        self.storage_options = dict(storage_options or {})
        self._session_args, self._client_args = client_settings(self.storage_options)  # validates
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        if counters is None:
            from shmem.counters import SharedCounters

            counters = SharedCounters(STORE_COUNTERS)
        self.counters = counters
        self._client: Any = None
        self._client_pid = -1
        self.endpoint = ""
        self.credentials_from = ""

    # -- configuration survives pickling; the connection does not ----------------------------------

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"], state["_client_pid"] = None, -1
        return state

    @property
    def url(self) -> str:
        return self.location.url()

    def describe(self, key: str) -> str:
        return self.location.url(key)

    def _boto(self) -> Any:
        """This process's client (made on first use; a forked or unpickled copy makes its own)."""
        if self._client is not None and self._client_pid == os.getpid():
            return self._client
        with _client_lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = self._make_client()
                self._client_pid = os.getpid()
        return self._client

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError as e:
            raise ImportError(
                f"{self.url}: reading an object store needs boto3: pip install 'coordl[s3]'"
            ) from e
        from botocore.exceptions import BotoCoreError

        try:
            return self._configure(boto3.session.Session(**self._session_args), Config, UNSIGNED)
        except BotoCoreError as e:  # e.g. a profile that is in no config file: one line, naming the URL
            raise ValueError(f"{self.url}: cannot set up the S3 client: {e}") from e

    def _configure(self, session: Any, Config: Any, UNSIGNED: Any) -> Any:  # noqa: N803 (botocore's names)
        config = Config(
            retries={"total_max_attempts": 1},  # retries are ours: each attempt is counted and backed off
            connect_timeout=self.storage_options.get("connect_timeout_s", self.connect_timeout_s),
            read_timeout=self.storage_options.get("read_timeout_s", self.read_timeout_s),
            max_pool_connections=self.max_connections,
            signature_version=UNSIGNED if self.storage_options.get("anon") else None,
        )
        client = session.client("s3", config=config, **self._client_args)
        self.endpoint = client.meta.endpoint_url
        if self.storage_options.get("anon"):
            self.credentials_from = "nowhere (anon=True)"
        elif "aws_access_key_id" in self._client_args:
            self.credentials_from = "storage_options"
        else:
            creds = session.get_credentials()
            self.credentials_from = (
                "nowhere (none found)" if creds is None else _credential_origin(creds.method)
            )
        return client

    # -- requests -------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The whole object ``key`` (a full key, e.g. ``self.location.key(relpath)``)."""
        return self._call(
            "GET", key, lambda c: _read_body(c.get_object(Bucket=self.location.bucket, Key=key))
        )

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from byte ``start`` (one ranged GET)."""
        if length <= 0:
            return b""
        rng = f"bytes={start}-{start + length - 1}"
        return self._call(
            "GET range",
            key,
            lambda c: _read_body(c.get_object(Bucket=self.location.bucket, Key=key, Range=rng)),
        )

    def list(self, prefix: str | None = None) -> list[ObjectInfo]:
        """Every object under ``prefix`` (default: the store's prefix), one LIST request per 1,000 keys."""
        prefix = self.location.prefix if prefix is None else prefix
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        out: list[ObjectInfo] = []
        token: str | None = None
        while True:
            args: dict[str, str] = {"Bucket": self.location.bucket, "Prefix": prefix}
            if token:
                args["ContinuationToken"] = token
            page = self._call("LIST", prefix, operator.methodcaller("list_objects_v2", **args))
            for obj in page.get("Contents", ()):
                mtime = obj.get("LastModified")
                out.append(ObjectInfo(
                    obj["Key"], int(obj.get("Size", 0)),
                    int(mtime.timestamp() * 1e9) if mtime is not None else 0, str(obj.get("ETag", "")).strip('"'),
                ))  # fmt: skip
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")

    def _call(self, op: str, key: str, request: Callable[[Any], Any]) -> Any:
        """One request with retries; every attempt is counted (see the module docstring for the errors)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._boto()
        start = time.monotonic()
        last: BaseException | None = None
        for attempt in range(self.attempts):
            if attempt:
                self.counters.add("store_retries")
                wait = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(wait * (0.5 + random.random() / 2))  # jitter: workers do not retry in step
            self.counters.add("store_requests")
            try:
                result = request(client)
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code", ""))
                status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
                self._raise_final(op, key, code, status, e)
                last = e
                continue
            except (
                BotoCoreError,
                OSError,
                _ShortBody,
            ) as e:  # connection refused/reset, timeouts, cut bodies
                last = e
                continue
            if isinstance(result, bytes):
                self.counters.add("store_bytes", len(result))
            return result
        raise StoreUnavailableError(
            f"{self.describe(key)}: {op} failed after {self.attempts} attempts over "
            f"{time.monotonic() - start:.1f} s against {self.endpoint or 'the default endpoint'} "
            f"(last error: {type(last).__name__}: {last})"
        )

    def _raise_final(self, op: str, key: str, code: str, status: str, e: BaseException) -> None:
        """Raise at once for errors a retry cannot fix; return for those worth retrying."""
        if code in _RETRY_CODES or status.startswith("5"):
            return
        where = self.describe(key)
        if code in _MISSING or status == "404":
            raise FileNotFoundError(2, f"{where}: no such {'bucket' if code == 'NoSuchBucket' else 'object'}")
        if code in _DENIED or status == "403":
            raise PermissionError(
                13,
                f"{where}: {op} refused by {self.endpoint} ({code}): check the credentials, which came from "
                f"{self.credentials_from}; pass storage_options={{'aws_access_key_id': ..., "
                f"'aws_secret_access_key': ...}} or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE",
            )
        raise OSError(f"{where}: {op} failed: {code or status}: {e}")

    def stats(self) -> dict[str, int]:
        """``store_requests``, ``store_bytes``, ``store_retries``, summed over every process using this store."""
        return {name: int(v) for name, v in self.counters.snapshot().items()}


class _ShortBody(Exception):
    """The body ended before Content-Length (a server or link cut mid-response): retried."""


def _read_body(response: dict) -> bytes:
    body = response["Body"]
    try:
        data = body.read()
    finally:
        body.close()
    expected = response.get("ContentLength")
    if expected is not None and len(data) != int(expected):
        raise _ShortBody(f"got {len(data)} of {expected} bytes")
    return data


def _credential_origin(method: str) -> str:
    """botocore's credential ``method`` in words, for the bad-credentials message."""
    return {
        "explicit": "storage_options",
        "env": "the environment (AWS_ACCESS_KEY_ID)",
        "shared-credentials-file": "~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE)",
        "config-file": "~/.aws/config (AWS_CONFIG_FILE)",
        "iam-role": "instance metadata (IAM role)",
    }.get(method, method)
