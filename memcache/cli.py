"""``memcache serve`` / ``memcache stop``: run a node's Redis for the sample cache and the partitioned cache.

    memcache serve                                                   # 127.0.0.1, a free port, 25% of RAM
    memcache serve --bind 10.0.0.5 --maxmemory 16G --port 6390       # prints the address and pid
    MEMCACHE_PASSWORD=s3cret memcache serve --maxmemory 16G          # requirepass from the environment
    memcache tls-init /etc/coordl/tls --hosts 10.0.0.5,10.0.0.6        # a CA, a certificate per node
    memcache serve --bind 10.0.0.5 --tls                             # TLS only (MEMCACHE_TLS_* files,
                                                                     # else a CA made here, printed)

One server per node serves both ``memcache.RedisStore`` (keys ``mc1:``) and the partitioned raw-item
cache of ``coordl.DataLoader(partitioned=True)`` (keys ``cdl1:``; point it here with
``COORDL_PEER_REDIS=host:port`` and the same ``MEMCACHE_PASSWORD``).
    memcache stop --port 6390

Errors are one line (``memcache SUBCMD: error: ...``), never a traceback.

The server runs detached (it outlives the command) with its config, log and pid file in
``--dir`` (default ``$TMPDIR/memcache-<uid>/<host>-<port>``); ``stop`` finds it there.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from memcache.server import free_port, start_redis, stop_pid
from memcache.tls import ENV_CA, ENV_CERT, ENV_KEY, TLS

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"16G"`` -> 17179869184 (binary units K, M, G, T; a plain number is bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512M, 16G)")
    return int(float(m[1]) * _UNITS[m[2].upper()])


# Default cache budget: a quarter of the machine's memory leaves room for the training job itself (its model,
# its loader workers' page cache and prep buffers), which runs on the same node.
DEFAULT_MAXMEMORY_FRACTION = 0.25


def default_maxmemory() -> int:
    """A quarter of this machine's memory, in bytes (what ``memcache serve`` uses without ``--maxmemory``)."""
    import psutil

    return int(psutil.virtual_memory().total * DEFAULT_MAXMEMORY_FRACTION)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, got {value}")
    return value


def _size(text: str) -> int:
    value = parse_bytes(text)
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(
            f"{text!r} is below 1M: too small for a sample cache (e.g. 512M, 16G)"
        )
    return value


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _state_dir(args: argparse.Namespace, port: int) -> Path:
    if args.dir:
        return Path(args.dir)
    return Path(tempfile.gettempdir()) / f"memcache-{os.getuid()}" / f"{args.bind}-{port}"


def _serve_tls(args: argparse.Namespace, workdir: Path) -> tuple[TLS | None, str]:
    """The server's TLS files (``MEMCACHE_TLS_*``, else a CA made once under the state root), and what
    to tell the user about them."""
    if not args.tls:
        return None, ""
    tls = TLS.from_env()
    if tls is not None:
        return tls, f"tls on ({ENV_CA}={tls.ca})"
    from memcache import certs

    ca_dir = Path(tempfile.gettempdir()) / f"memcache-{os.getuid()}" / "tls"
    ca_key, ca_cert = certs.load_ca(ca_dir) if (ca_dir / "ca.key").exists() else certs.make_ca(ca_dir)
    tls = certs.node_tls(ca_key, ca_cert, workdir / "tls", "server", [args.bind])
    client = certs.node_tls(ca_key, ca_cert, ca_dir, "client")
    hint = f"export {ENV_CA}={client.ca} {ENV_CERT}={client.cert} {ENV_KEY}={client.key}"
    return tls, f"tls on, a CA of this host in {ca_dir}; clients here: {hint}"


def _serve(args: argparse.Namespace) -> int:
    password = os.environ.get(args.password_env) or None
    maxmemory = args.maxmemory
    if maxmemory is None:
        maxmemory = default_maxmemory()
        print(
            f"memcache: no --maxmemory given: using {_gib(maxmemory)}, a quarter of this machine's memory",
            flush=True,
        )
    try:
        port = args.port or free_port(args.bind)
    except OSError as e:
        raise ValueError(f"argument --bind: cannot listen on {args.bind!r}: {e.strerror or e}") from e
    workdir = _state_dir(args, port)
    tls, tls_note = _serve_tls(args, workdir)
    server = start_redis(
        maxmemory, host=args.bind, port=port, password=password, workdir=workdir, detach=True, tls=tls
    )
    url = f"rediss://{server.address}" if tls else server.address
    print(
        f"memcache: redis-server pid {server.pid} serving {url} "
        f"(maxmemory {maxmemory} bytes = {_gib(maxmemory)}, noeviction, "
        f"password {'set' if password else 'none'}, dir {workdir})\n"
        + (f"memcache: {tls_note}\n" if tls_note else "")
        + f"use: memcache.RedisStore(nodes=['{url}', ...]{', password=...' if password else ''})\n"
        f"and/or: COORDL_PEER_REDIS={url} for coordl.DataLoader(partitioned=True) on this node\n"
        f"stop: memcache stop {f'--dir {workdir}' if args.dir else f'--bind {args.bind} --port {port}'}"
    )
    if args.foreground:
        try:
            while server._proc is not None and server._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            server.stop()
    return 0


def _stop(args: argparse.Namespace) -> int:
    pidfile = _state_dir(args, args.port) / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except FileNotFoundError:
        where = "argument --dir" if args.dir else "argument --port"
        raise ValueError(
            f"{where}: no server recorded in {pidfile} (was it started by 'memcache serve'?)"
        ) from None
    except ValueError:
        raise ValueError(f"{pidfile} does not hold a pid: remove it and stop the server by hand") from None
    stopped = stop_pid(pid)
    print(f"memcache: {'stopped' if stopped else 'no running'} redis-server pid {pid} ({pidfile.parent})")
    return 0


def _tls_init(args: argparse.Namespace) -> int:
    from memcache import certs

    d = Path(args.dir)
    made = not (d / "ca.key").exists()
    ca_key, ca_cert = certs.make_ca(d) if made else certs.load_ca(d)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    for host in hosts:
        certs.node_tls(ca_key, ca_cert, d, host, [host])
    certs.node_tls(ca_key, ca_cert, d, "client")
    print(
        f"memcache: {'made' if made else 'reused'} the CA {d / 'ca.crt'} (its key: {d / 'ca.key'}, keep it "
        f"off the nodes); certificates for {', '.join(hosts) or 'no node'} and 'client' in {d}\n"
        f"on node H: {ENV_CA}={d / 'ca.crt'} {ENV_CERT}={d}/H.crt {ENV_KEY}={d}/H.key memcache serve --bind H --tls"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memcache", description="Run a node's sample-cache Redis server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start redis-server (detached) with maxmemory + noeviction")
    serve.add_argument("--bind", default="127.0.0.1", help="interface address to listen on")
    serve.add_argument("--port", type=_port, default=0, help="TCP port (default: a free one)")
    serve.add_argument(
        "--maxmemory",
        type=_size,
        default=None,
        help="cache budget, e.g. 16G (default: a quarter of this machine's memory, printed at start)",
    )
    serve.add_argument(
        "--password-env",
        default="MEMCACHE_PASSWORD",
        help="environment variable holding the requirepass password (default MEMCACHE_PASSWORD)",
    )
    serve.add_argument("--dir", help="config/log/pid directory")
    serve.add_argument(
        "--tls",
        action="store_true",
        help=f"TLS only, client certificates required: files from {ENV_CA}, {ENV_CERT}, {ENV_KEY}, "
        "else a CA made once for this host",
    )
    serve.add_argument("--foreground", action="store_true", help="wait; Ctrl-C stops the server")
    serve.set_defaults(func=_serve)
    init = sub.add_parser("tls-init", help="make a CA and certificates for the nodes' Redis (TLS)")
    init.add_argument("dir", help="directory for ca.crt, ca.key and <host>.crt/.key (made 0700)")
    init.add_argument("--hosts", default="", help="comma-separated addresses clients dial, one cert each")
    init.set_defaults(func=_tls_init)
    stop = sub.add_parser("stop", help="stop a server started by 'memcache serve'")
    stop.add_argument("--bind", default="127.0.0.1")
    stop.add_argument("--port", type=_port, default=0)
    stop.add_argument("--dir")
    stop.set_defaults(func=_stop)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "stop" and not args.dir and not args.port:
        print("memcache stop: error: give --port (and --bind if not 127.0.0.1) or --dir", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"memcache {args.command}: interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, ValueError) as e:  # FileNotFoundError (no redis-server) is an OSError
        print(f"memcache {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
