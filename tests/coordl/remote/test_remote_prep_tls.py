"""Remote prep through a Ray cluster whose gRPC channels are TLS (``RAY_USE_TLS=1``), as docs/remote_prep.md
says to turn it on: the batches are those of local prep, and the cluster's port speaks TLS with a
certificate of the job's CA (a handshake with our CA succeeds; without a client certificate it is
refused).

The cluster runs in a child process of its own (Ray allows one cluster per process, and the TLS
variables must be in the environment of every Ray process and the driver from the start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="remote prep needs Ray: pip install 'coordl[ray]'")

from memcache import certs  # noqa: E402
from tests.coordl.remote.ray_cluster import ROOT  # noqa: E402
from tests.support.netns import skip_reason as netns_skip_reason  # noqa: E402

DRIVER = r"""
import json, os, socket, ssl, sys
import torch
import coordl
from coordl.datasets.synth import make_dataset
from tests.coordl.remote.ray_cluster import RayCluster

root = make_dataset(sys.argv[1], n=24, classes=3, width=64, height=48, seed=1)

def batches(remote):
    loader = coordl.DataLoader(coordl.ImageFolder(root, transform=coordl.transforms.train_transform(32)),
                               batch_size=4, shuffle=True, num_workers=0 if remote else 1,
                               generator=torch.Generator().manual_seed(5), remote_prep=remote)
    try:
        out = [(x.clone(), y.clone()) for x, y in loader]
        return out, loader.stats()
    finally:
        loader.close()

local, _ = batches(None)
c = RayCluster()
try:
    c.start_head()

    def handshake(with_cert):
        ctx = ssl.create_default_context(cafile=os.environ["RAY_TLS_CA_CERT"])
        ctx.set_alpn_protocols(["h2"])
        if with_cert:
            ctx.load_cert_chain(os.environ["RAY_TLS_SERVER_CERT"], os.environ["RAY_TLS_SERVER_KEY"])
        try:
            with socket.create_connection(("127.0.0.1", c.port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                    version = tls.version()
                    # TLS 1.3: a refused client certificate shows on the first read (an alert, or EOF)
                    return f"{version} answered" if tls.recv(1) else "refused: closed"

        except (ssl.SSLError, OSError) as exc:
            return "refused: " + type(exc).__name__

    probes = {"with_cert": handshake(True), "without_cert": handshake(False)}
    prep = coordl.RemotePrep(c.address, token=c.token)
    prep.connect()
    c.add_node()
    remote, stats = batches(prep)
finally:
    import ray
    ray.shutdown()
    c.stop()
same = len(local) == len(remote) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                         for a, b in zip(local, remote))
print("RESULT", json.dumps({"same": same, "remote_items": stats["remote_items"], **probes}), flush=True)
"""


@pytest.mark.slow
def test_remote_prep_over_ray_tls(tmp_path: Path) -> None:
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    ca_key, ca_cert = certs.make_ca(tmp_path / "pki")
    node = certs.node_tls(ca_key, ca_cert, tmp_path / "pki", "ray", ["127.0.0.1", "localhost"])
    env = {
        **os.environ,
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": node.cert,
        "RAY_TLS_SERVER_KEY": node.key,
        "RAY_TLS_CA_CERT": node.ca,
        "PYTHONPATH": str(ROOT),
    }
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "jpegs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))[7:])
    assert result["same"] and result["remote_items"] == 24
    assert result["with_cert"].startswith("TLSv1") and result["with_cert"].endswith("answered")
    assert result["without_cert"].startswith("refused")
