"""The copy process behind ``BackgroundPrefetch`` and ``stage_all``: stages the files listed on its stdin.

Run as ``python -m nfs_cache.copier SRC STAGE_DIR --parent-pid PID``; stdin carries one ``<size> <mtime_ns>
<percent-encoded relpath>`` line per file. A separate module (not ``prefetch``) so that ``-m`` does not re-run a
module the package already imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.parse

from nfs_cache.sources import RemoteFile
from nfs_cache.stager import StagedSource


def _watch_parent(parent_pid: int) -> None:
    # Orphaned copy processes would keep reading the remote after training ended: leave with the parent.
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="internal: stage the files listed on stdin")
    parser.add_argument("src")
    parser.add_argument("stage_dir")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--budget-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    staged = StagedSource(args.src, args.stage_dir, budget_bytes=args.budget_bytes)
    for line in sys.stdin:
        size, mtime_ns, rel = line.rstrip("\n").split(" ", 2)
        relpath = urllib.parse.unquote(rel)
        staged.add_listing([RemoteFile(relpath, int(size), int(mtime_ns))])
        if staged.staging_stopped:
            break
        if not staged.is_staged(relpath):
            staged.read(relpath)
    staged.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except KeyboardInterrupt:
        sys.exit(130)
