"""Where a bucket's address and credentials come from: ``s3://`` URLs and ``storage_options``.

Credentials and the endpoint come from the standard places, in boto3's order: an explicit
``storage_options=`` first, then the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``,
``AWS_DEFAULT_REGION``), then the config files (``~/.aws/credentials`` and ``~/.aws/config``, whose
profiles may also set ``endpoint_url``), then instance metadata. boto3 resolves all of that itself;
this module only maps what a user passes explicitly, accepting both boto3's names and s3fs's (so a
``storage_options`` dict written for s3fs/fsspec works unchanged).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

__all__ = ["S3Url", "parse_s3_url", "is_s3_url", "client_settings", "SCHEMES"]

SCHEMES = ("s3", "s3a")

# s3fs/fsspec name -> boto3 client argument
_S3FS_NAMES = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "endpoint": "endpoint_url",
    "region": "region_name",
}
_CLIENT_ARGS = {
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "endpoint_url",
    "region_name",
}
_OWN = {"profile", "anon", "client_kwargs", "config_kwargs", "connect_timeout_s", "read_timeout_s"}


@dataclass(frozen=True)
class S3Url:
    """``s3://bucket/prefix``: the bucket and the key prefix (no leading slash, no trailing slash)."""

    bucket: str
    prefix: str

    def key(self, relpath: str) -> str:
        """The object key of ``relpath`` under the prefix."""
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def url(self, key: str = "") -> str:
        """``s3://bucket/key`` (the prefix's URL when ``key`` is empty), for messages."""
        return f"s3://{self.bucket}/{key or self.prefix}".rstrip("/")


def is_s3_url(text: object) -> bool:
    """True for ``s3://...`` (and Hadoop's ``s3a://``) strings."""
    return isinstance(text, str) and text.split("://", 1)[0].lower() in SCHEMES and "://" in text


def parse_s3_url(url: str) -> S3Url:
    """Split ``s3://bucket/some/prefix/`` into bucket and prefix; a clear ValueError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in SCHEMES or not parts.netloc:
        raise ValueError(f"invalid object-store URL {url!r}: expected s3://bucket[/prefix]")
    if parts.query or parts.fragment:
        raise ValueError(
            f"{url!r}: options go in storage_options=, not in the URL (e.g. "
            "storage_options={'endpoint_url': 'http://127.0.0.1:9000'})"
        )
    return S3Url(parts.netloc, parts.path.strip("/"))


def client_settings(storage_options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(session arguments, client arguments) for boto3 from ``storage_options``; unknown names raise.

    Accepts boto3's names (``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``,
    ``aws_session_token``, ``region_name``), s3fs's (``key``, ``secret``, ``token``,
    ``client_kwargs={"endpoint_url": ..., "region_name": ...}``), ``profile`` (a profile of the AWS
    config files) and ``anon=True`` (unsigned requests to a public bucket).
    """
    opts = dict(storage_options or {})
    unknown = sorted(set(opts) - set(_S3FS_NAMES) - _CLIENT_ARGS - _OWN)
    if unknown:
        raise ValueError(
            f"storage_options: unknown option(s) {unknown}; known: endpoint_url, aws_access_key_id, "
            "aws_secret_access_key, aws_session_token, region_name, profile, anon (or s3fs's key, secret, "
            "token, client_kwargs)"
        )
    client: dict[str, Any] = {}
    for name, value in dict(opts.pop("client_kwargs", None) or {}).items():
        name = str(name)
        client[_S3FS_NAMES.get(name, name)] = value
    for name, value in opts.items():
        if name in _OWN:
            continue
        client[_S3FS_NAMES.get(name, name)] = value
    session = {"profile_name": opts["profile"]} if opts.get("profile") else {}
    return session, client
