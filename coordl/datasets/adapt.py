"""Adapting datasets that do not implement the fetch/prep split (what ``coordl.DataLoader`` is given).

:func:`as_item_source`: a source that already has ``fetch``/``prep`` is returned as is; a
torchvision-style dataset (``.samples``, ``.loader``, ``.transform``) is split automatically
(:class:`TorchvisionStyleSource`); any other map-style dataset runs as one opaque stage
(:class:`OpaqueSource`, ``opaque = True``, with a warning: only whole-sample caching can apply).
"""

from __future__ import annotations

import io
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coordl.datasets.source import is_item_source
from coordl.errors import CorruptItemError
from coordl.fileread.read import read_file
from coordl.prep.decode import decode_image

__all__ = ["OpaqueSource", "TorchvisionStyleSource", "as_item_source"]


class TorchvisionStyleSource:
    """Splits a torchvision-style dataset (``.samples`` of (path, target), ``.loader``, ``.transform``).

    ``fetch`` reads the file's bytes. ``prep`` rebuilds what ``loader(path)`` would return from
    those bytes: for torchvision's default loaders (recognised by name, torchvision is never
    imported) it decodes with simplejpeg into an RGB PIL image, as ``pil_loader`` would; a custom
    loader gets an in-memory file object named like the original (``Image.open`` accepts it), and
    if it rejects that (it calls ``open()`` or reads the name), a temporary file in /dev/shm holding
    the bytes. Then the user's ``transform``/``target_transform`` run unchanged.
    """

    thread_safe_fetch = True  # fetch only reads the file at the sample's path

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        loader = dataset.loader
        name = getattr(loader, "__name__", "")
        module = getattr(loader, "__module__", "") or ""
        self._fast_decode = module.startswith("torchvision") and name in ("pil_loader", "default_loader")
        self._loader_mode = "bytesio"  # switched to "tempfile" once when the loader rejects file objects

    def __len__(self) -> int:
        return len(self.dataset.samples)

    def describe(self, index: int) -> str:
        return os.fspath(self.dataset.samples[index][0])

    def fetch(self, index: int) -> bytes:
        return read_file(self.dataset.samples[index][0])

    def fetch_uncached(self, index: int) -> bytes:
        """As :meth:`fetch`, past the OS page cache where the file system allows (see
        :mod:`coordl.fetch.pagecache`)."""
        return read_file(self.dataset.samples[index][0], cached=False)

    def local_file(self, index: int) -> str:
        """The file :meth:`fetch` reads whole: a loader's read-ahead reads it (:class:`coordl.fileread.read.ReadAhead`)."""
        return os.fspath(self.dataset.samples[index][0])

    def _load(self, raw: bytes, index: int) -> Any:
        path = self.describe(index)
        if self._fast_decode:
            from PIL import Image

            try:
                return Image.fromarray(decode_image(raw))
            except CorruptItemError as e:
                raise CorruptItemError(f"{path}: {e}", path=path, index=index) from e
        if self._loader_mode == "bytesio":
            buf = io.BytesIO(raw)
            buf.name = path  # some loaders look at the extension
            try:
                return self.dataset.loader(buf)
            except (TypeError, AttributeError):
                self._loader_mode = "tempfile"
        suffix = Path(path).suffix
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(suffix=suffix, dir=directory) as tmp:
            tmp.write(raw)
            tmp.flush()
            return self.dataset.loader(tmp.name)

    def prep(self, raw: bytes, index: int) -> Any:
        """``(transform(loader(...)), target_transform(target))`` as the dataset's __getitem__ does."""
        target = self.dataset.samples[index][1]
        try:
            sample = self._load(raw, index)
        except CorruptItemError:
            raise
        except OSError as e:  # PIL.UnidentifiedImageError and truncation errors are OSErrors
            path = self.describe(index)
            raise CorruptItemError(f"{path}: {e}", path=path, index=index) from e
        transform = getattr(self.dataset, "transform", None)
        target_transform = getattr(self.dataset, "target_transform", None)
        if transform is not None:
            sample = transform(sample)
        if target_transform is not None:
            target = target_transform(target)
        return sample, target


class OpaqueSource:
    """Any map-style dataset, run as one stage: ``fetch`` returns b"", ``prep`` calls ``dataset[i]``.

    ``opaque = True`` tells the loader that raw bytes do not exist here: a raw-item cache
    (``cache_bytes``) cannot help and storage bytes cannot be counted.
    """

    opaque = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def fetch(self, index: int) -> bytes:
        return b""

    def prep(self, raw: bytes, index: int) -> Any:
        return self.dataset[index]

    def describe(self, index: int) -> str:
        return f"{type(self.dataset).__name__}[{index}]"


def _is_torchvision_style(ds: Any) -> bool:
    samples = getattr(ds, "samples", None)
    if not callable(getattr(ds, "loader", None)) or not isinstance(samples, Sequence) or not samples:
        return False
    first = samples[0]
    return isinstance(first, (tuple, list)) and len(first) == 2 and isinstance(first[0], (str, os.PathLike))


def as_item_source(dataset: Any) -> Any:
    """Adapt ``dataset`` to the fetch/prep protocol (see the module docstring for the three cases)."""
    if is_item_source(dataset):
        return dataset
    if _is_torchvision_style(dataset):
        return TorchvisionStyleSource(dataset)
    if callable(getattr(dataset, "__getitem__", None)) and callable(getattr(dataset, "__len__", None)):
        warnings.warn(
            f"coordl: {type(dataset).__name__} has no fetch/prep split (no fetch()/prep(), no .samples/.loader); "
            "it runs as one opaque stage, so only whole-sample caching applies and cache_bytes has no effect. "
            "Use coordl.ImageFolder / FileListDataset or add fetch(i)/prep(raw, i) to get the raw-item cache.",
            UserWarning,
            stacklevel=2,
        )
        return OpaqueSource(dataset)
    raise TypeError(
        f"coordl: cannot load from {type(dataset).__name__}: a dataset needs __len__ and __getitem__ "
        "(map-style) or __len__, fetch(i) and prep(raw, i)"
    )
