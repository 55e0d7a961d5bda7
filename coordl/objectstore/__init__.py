"""coordl.objectstore: train from an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, GCS's S3 API) through coordl.

An object store answers each GET with a price and a latency, so it is where a cache that never thrashes pays the
most. This package is the bucket side of coordl's fetch path:

* :class:`ObjectStore` (client.py): GET, ranged GET and LIST through boto3, one client per process, thread-safe,
  with retries and backoff, clear errors, and counters of requests and bytes (``stats()``);
* :mod:`~coordl.objectstore.options`: ``s3://bucket/prefix`` URLs and ``storage_options=`` (boto3's or s3fs's
  names); credentials and endpoint otherwise from the environment and the AWS config files;
* :func:`cached_listing` (listing.py): a prefix listed once and kept with the dataset's identity;
* :class:`S3Source` (source.py): a bucket prefix as a dataset root, for streaming and for staging
  (``coordl stage s3://... DST``);
* :class:`UrlReader` (urls.py): ``s3://`` keys of any bucket, for ``FileListDataset``.

The datasets (``ImageFolder``, ``FileListDataset``, ``TarShards``, ``LMDBDataset``) accept ``s3://`` roots and use
these; every tier above them (MinIO cache, partitioned cache, coordinated prep, sample cache) works unchanged.
See docs/objectstore.md.
"""

from coordl.objectstore.client import STORE_COUNTERS, ObjectInfo, ObjectStore, StoreUnavailableError
from coordl.objectstore.listing import cached_listing
from coordl.objectstore.options import S3Url, is_s3_url, parse_s3_url
from coordl.objectstore.source import S3Source
from coordl.objectstore.urls import UrlReader

__all__ = [
    "ObjectStore",
    "ObjectInfo",
    "StoreUnavailableError",
    "STORE_COUNTERS",
    "S3Source",
    "S3Url",
    "UrlReader",
    "cached_listing",
    "is_s3_url",
    "parse_s3_url",
]
