"""Where a remote dataset lives: a mounted directory, an ``nfs://`` export, or an fsspec URL.

Every source answers the same three questions: which files are there (relative path, size, mtime), what are the
bytes of one file, and what is its full address (for error messages). Sources hold configuration only and open
connections lazily, once per process: a libnfs context must never cross a ``fork`` (its socket and RPC state would
be shared by two processes), so a pickled or forked copy notices the new pid and reconnects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import threading
import urllib.parse
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RemoteFile",
    "Source",
    "LocalSource",
    "NfsSource",
    "FsspecSource",
    "open_source",
    "register_scheme",
]

# Seconds an NFS RPC may take before the call fails instead of hanging a training worker forever.
DEFAULT_NFS_TIMEOUT_S = 60.0
# Bytes per NFSv4 READ when the server's maximum is unknown (libnfs reports it for v3 only); ganesha's is 1 MiB.
DEFAULT_READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file of the remote dataset: path relative to the source root, size and mtime (ns)."""

    relpath: str
    size: int
    mtime_ns: int


class Source:
    """Base of all sources: configuration that survives pickling plus a per-process connection."""

    url: str

    def list_files(self) -> list[RemoteFile]:
        """Every regular file under the root, sorted by relative path."""
        raise NotImplementedError

    def read(self, relpath: str) -> bytes:
        """The whole content of one file."""
        raise NotImplementedError

    def describe(self, relpath: str) -> str:
        """The full address of one file, for messages."""
        return f"{self.url.rstrip('/')}/{relpath}"

    def close(self) -> None:
        """Drop the connection of this process (it reopens on next use)."""


def _check_relpath(relpath: str) -> str:
    # A relative path must stay under the root: refuse absolute paths and "..", which would let a caller read
    # (or, via the stage directory, write) outside the dataset.
    parts = relpath.split("/")
    if relpath.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid dataset path {relpath!r}: must be relative, without '.', '..' or '//'")
    return relpath


class LocalSource(Source):
    """A directory on a mounted filesystem (NFS mount, network disk or plain local disk)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"source directory {self.root!r} does not exist")

    def list_files(self) -> list[RemoteFile]:
        out: list[RemoteFile] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            dirnames.sort()
            # The relative folder once per folder, not os.path.relpath per file (two abspath calls each:
            # 40 of the 68 s a 10^6-file listing took).
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            prefix = "" if rel_dir == "." else rel_dir + "/"
            for name in filenames:
                st = os.stat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    out.append(RemoteFile(prefix + name, st.st_size, st.st_mtime_ns))
        out.sort(key=lambda f: f.relpath)
        return out

    def read(self, relpath: str) -> bytes:
        with open(os.path.join(self.root, _check_relpath(relpath)), "rb") as f:
            return f.read()

    def describe(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)


def _libnfs_so() -> Any:
    # nfs_set_timeout is in libnfs but not in its Python binding: call it through ctypes on the same context.
    name = ctypes.util.find_library("nfs") or "libnfs.so.13"
    so = ctypes.CDLL(name)
    so.nfs_set_timeout.argtypes = [ctypes.c_void_p, ctypes.c_int]
    so.nfs_set_timeout.restype = None
    return so


class _NfsConnection:
    """One mounted libnfs context, used by one thread of one process at a time."""

    def __init__(self, url: str, timeout_s: float, read_chunk_bytes: int) -> None:
        self.read_chunk_bytes = read_chunk_bytes
        with warnings.catch_warnings():  # the binding's SWIG wrapper imports the deprecated ``imp``
            warnings.simplefilter("ignore", DeprecationWarning)
            from libnfs import libnfs as lib  # optional dependency, imported only when an nfs:// URL is used

        self.lib = lib
        self.ctx = lib.nfs_init_context()
        if self.ctx is None:
            raise OSError(f"{url}: libnfs could not create a context")
        try:
            _libnfs_so().nfs_set_timeout(int(self.ctx), int(timeout_s * 1000))
        except (OSError, AttributeError, TypeError):
            pass  # an older libnfs without timeouts still works, it only cannot time out
        self._url = lib.nfs_parse_url_dir(self.ctx, url)
        if self._url is None:
            raise ValueError(f"invalid NFS URL {url!r}: {lib.nfs_get_error(self.ctx)}")
        rc = lib.nfs_mount(self.ctx, self._url.server, self._url.path)
        if rc != 0:
            raise ConnectionError(f"cannot mount {url}: {lib.nfs_get_error(self.ctx)} (rc {rc})")

    def listdir(self, path: str) -> list[tuple[str, bool, int, int]]:
        """(name, is_dir, size, mtime_ns) of each entry of one directory."""
        lib = self.lib
        handle = lib.new_NFSDirHandle()
        rc = lib.nfs_opendir(self.ctx, path, handle)
        if rc != 0:
            raise OSError(-rc, f"opendir {path}: {lib.nfs_get_error(self.ctx)}")
        handle = lib.NFSDirHandle_value(handle)
        out = []
        try:
            while True:
                de = lib.nfs_readdir(self.ctx, handle)
                if de is None:
                    break
                if de.name in (".", ".."):
                    continue
                mtime = de.mtime
                mtime_ns = int(mtime.tv_sec) * 1_000_000_000 + int(mtime.tv_usec) * 1000
                out.append((de.name, stat.S_ISDIR(de.mode), int(de.size), mtime_ns))
        finally:
            lib.nfs_closedir(self.ctx, handle)
        return out

    def read(self, path: str) -> bytes:
        lib = self.lib
        fh = lib.new_NFSFileHandle()
        rc = lib.nfs_open(self.ctx, path, os.O_RDONLY, fh)
        if rc != 0:
            err = lib.nfs_get_error(self.ctx)
            if rc == -2:
                raise FileNotFoundError(2, f"{path}: {err}")
            raise OSError(-rc, f"open {path}: {err}")
        fh = lib.NFSFileHandle_value(fh)
        try:
            st = lib.nfs_stat_64()
            rc = lib.nfs_fstat64(self.ctx, fh, st)
            if rc != 0:
                raise OSError(-rc, f"fstat {path}: {lib.nfs_get_error(self.ctx)}")
            size = int(st.nfs_size)
            # At most one server-sized READ per call: libnfs 4.0 does not split an NFSv4 read larger than the
            # server's maximum (ganesha: 1 MiB), the call fails with "nfs_service failed" and the context is lost.
            chunk = int(self.lib.nfs_get_readmax(self.ctx)) or self.read_chunk_bytes
            out = bytearray(size)
            view = memoryview(out)
            buf = bytearray(min(chunk, size))
            pos = 0
            while pos < size:
                count = lib.nfs_read(self.ctx, fh, min(chunk, size - pos), buf)
                if count < 0:
                    raise OSError(-count, f"read {path}: {lib.nfs_get_error(self.ctx)}")
                if count == 0:
                    raise OSError(5, f"short read of {path}: {pos} of {size} bytes")
                view[pos : pos + count] = buf[:count]
                pos += count
            return bytes(out)
        finally:
            lib.nfs_close(self.ctx, fh)

    def close(self) -> None:
        if self.ctx is not None:
            self.lib.nfs_destroy_url(self._url)
            self.lib.nfs_destroy_context(self.ctx)
            self.ctx = None


class NfsSource(Source):
    """``nfs://server/export/path[?version=4&nfsport=N]`` read through the user-space libnfs client.

    No kernel mount is needed. One connection per (process, thread): libnfs contexts are not thread-safe and must
    not be shared across fork. ``read_chunk_bytes`` must not exceed the server's maximum READ size (NFSv4).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = DEFAULT_NFS_TIMEOUT_S,
        read_chunk_bytes: int = DEFAULT_READ_CHUNK_BYTES,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "nfs" or not parts.hostname:
            raise ValueError(
                f"invalid NFS URL {url!r}: expected nfs://server/export/path[?version=4&nfsport=N]"
            )
        self.url = url
        self.timeout_s = timeout_s
        self.read_chunk_bytes = read_chunk_bytes
        # libnfs parses nfs://server/<mount path>?args; keep the query to pass it through unchanged.
        self._query = parts.query
        self._base = f"nfs://{parts.netloc}{parts.path.rstrip('/') or '/'}"
        self._local = threading.local()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"url": self.url, "timeout_s": self.timeout_s, "read_chunk_bytes": self.read_chunk_bytes}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["url"], state["timeout_s"], state["read_chunk_bytes"])

    def _conn(self) -> _NfsConnection:
        if self._pid != os.getpid():  # forked: the parent's contexts belong to the parent
            self._local = threading.local()
            self._pid = os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            mount_url = self._base + "/" + (f"?{self._query}" if self._query else "")
            conn = _NfsConnection(mount_url, self.timeout_s, self.read_chunk_bytes)
            self._local.conn = conn
        return conn

    def list_files(self) -> list[RemoteFile]:
        conn = self._conn()
        out: list[RemoteFile] = []
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            for name, is_dir, size, mtime_ns in conn.listdir("/" + rel_dir):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if is_dir:
                    stack.append(rel)
                else:
                    out.append(RemoteFile(rel, size, mtime_ns))
        out.sort(key=lambda f: f.relpath)
        return out

    def read(self, relpath: str) -> bytes:
        return self._conn().read("/" + _check_relpath(relpath))

    def describe(self, relpath: str) -> str:
        suffix = f"?{self._query}" if self._query else ""
        return f"{self._base.rstrip('/')}/{relpath}{suffix}"

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._pid == os.getpid():
            conn.close()
        self._local = threading.local()


class FsspecSource(Source):
    """Any URL an installed fsspec implementation understands (``s3://``, ``gcs://``, ``http://``, ``memory://``...)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self._fs_pid = -1
        self._fs: Any = None
        self._root = fsspec.core.split_protocol(self.url)[1] or "/"
        self._get_fs()  # fail early on an unknown protocol, naming the URL

    def __getstate__(self) -> dict:
        return {"url": self.url}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["url"])

    def _get_fs(self) -> Any:
        if self._fs is None or self._fs_pid != os.getpid():
            import fsspec

            try:
                self._fs = fsspec.core.url_to_fs(self.url)[0]
            except (ImportError, ValueError) as e:
                raise ValueError(f"no fsspec filesystem for {self.url!r}: {e}") from e
            self._fs_pid = os.getpid()
        return self._fs

    def list_files(self) -> list[RemoteFile]:
        fs = self._get_fs()
        root = fs._strip_protocol(self.url).rstrip("/")
        out = []
        for path, info in fs.find(root, detail=True).items():
            if info.get("type", "file") != "file":
                continue
            rel = path[len(root) :].lstrip("/")
            mtime = info.get("mtime") or info.get("LastModified") or 0
            mtime_ns = int(mtime * 1e9) if isinstance(mtime, (int, float)) else 0
            out.append(RemoteFile(rel, int(info.get("size") or 0), mtime_ns))
        out.sort(key=lambda f: f.relpath)
        return out

    def read(self, relpath: str) -> bytes:
        fs = self._get_fs()
        root = fs._strip_protocol(self.url).rstrip("/")
        return fs.cat_file(f"{root}/{_check_relpath(relpath)}")


# URL scheme -> factory, registered by packages above this one (coordl.objectstore registers ``s3``): they may
# import nfs_cache, not the reverse. A registered scheme wins over fsspec's implementation of it.
_SCHEMES: dict[str, Any] = {}


def register_scheme(scheme: str, factory: Any) -> None:
    """Make ``open_source("<scheme>://...")`` return ``factory(url)``."""
    _SCHEMES[scheme.lower()] = factory


def open_source(src: str | os.PathLike | Source) -> Source:
    """A ``Source`` for a directory path, an ``nfs://`` URL, a registered scheme or an fsspec URL
    (``file://`` maps to a directory)."""
    if isinstance(src, Source):
        return src
    text = os.fspath(src)
    factory = _SCHEMES.get(text.split("://", 1)[0].lower()) if "://" in text else None
    if factory is not None:
        return factory(text)
    if text.startswith("nfs://"):
        return NfsSource(text)
    if text.startswith("file://"):
        return LocalSource(text[len("file://") :])
    if "://" in text:
        return FsspecSource(text)
    return LocalSource(text)
