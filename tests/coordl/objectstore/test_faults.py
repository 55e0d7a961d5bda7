"""A throttled link, a response cut mid-body, retries: the store stays correct, slower, and says what failed."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

import coordl
from coordl.objectstore import ObjectStore, StoreUnavailableError
from tests.support.s3server import S3Server, s3server_missing_reason


class _CutServer:
    """An HTTP server on loopback that promises ``size`` bytes and closes after half of them, every time."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.requests += 1
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.size}\r\nContent-Type: image/jpeg\r\n\r\n"
                conn.sendall(head.encode() + b"\xff" * (self.size // 2))

    def close(self) -> None:
        self.sock.close()


def test_a_body_cut_mid_response_is_retried_and_never_returned_half():
    srv = _CutServer()
    try:
        store = ObjectStore("s3://data/train", {"endpoint_url": f"http://127.0.0.1:{srv.port}",
                            "aws_access_key_id": "k", "aws_secret_access_key": "s"},
                            attempts=3, backoff_s=0.01)  # fmt: skip
        with pytest.raises(
            StoreUnavailableError, match=r"s3://data/train/a/1\.jpg: GET failed after 3 attempts"
        ):
            store.get("train/a/1.jpg")
        assert srv.requests == 3
        stats = store.stats()
        assert stats["store_requests"] == 3 and stats["store_retries"] == 2 and stats["store_bytes"] == 0
    finally:
        srv.close()


def test_retries_back_off_exponentially():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed below: connections are refused
    store = ObjectStore("s3://data", {"endpoint_url": f"http://127.0.0.1:{port}", "aws_access_key_id": "k",
                                      "aws_secret_access_key": "s"}, attempts=4, backoff_s=0.1)  # fmt: skip
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="after 4 attempts"):
        store.get("x.jpg")
    # waits of 0.1, 0.2, 0.4 s, each jittered to 50-100%: at least 0.35 s in all
    assert time.monotonic() - start >= 0.35


@pytest.mark.netns
@pytest.mark.slow
def test_a_throttled_link_bounds_the_rate_and_reads_stay_correct(tmp_path):
    reason = s3server_missing_reason(netns=True)
    if reason:
        pytest.skip(reason)
    rate_mbit = 40
    blobs = {f"cls/{i}.jpg": os.urandom(2 << 20) for i in range(4)}  # 8 MiB: far above tbf's 256 kB burst
    with S3Server(netns=True, rate=f"{rate_mbit}mbit", delay_ms=5) as srv:
        srv.create_bucket("slow")
        client = srv.client()
        for key, body in blobs.items():
            client.put_object(Bucket="slow", Key=f"train/{key}", Body=body)
        ds = coordl.ImageFolder(
            "s3://slow/train", transform=lambda b: b, storage_options=srv.storage_options()
        )
        start = time.monotonic()
        got = {ds.items[i][0]: ds[i][0] for i in range(len(ds))}
        elapsed = time.monotonic() - start
    assert got == blobs
    floor = sum(map(len, blobs.values())) / (rate_mbit * 1e6 / 8)  # the link cannot go faster than its rate
    assert elapsed >= 0.8 * floor, (elapsed, floor)
    assert ds.stats()["store_bytes"] == sum(map(len, blobs.values()))
