"""A dense table (row ``k`` holds key ``k + 1``: item indices) read a batch of rows at a time.

:class:`DenseTable` is :class:`shmem.table.AppendTable` with one more read: :meth:`DenseTable.get_rows`
answers a whole batch of item indices in one NumPy gather of their rows, where :meth:`AppendTable.get`
reads a dozen words per key in Python (0.5 us an item, a third of a tiny item's whole load in a
loader worker). The answers are :meth:`AppendTable.get`'s, checks included: a row is served as it is only
once a reader has checked it (this process, or on x86-64 any process: the row's mark; see
:mod:`shmem.table`), and a row no reader has checked yet is checked here first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shmem import table as _table
from shmem.segment import Segment
from shmem.table import HEADER_BYTES, ROW_WORDS, AppendTable

__all__ = ["DenseTable"]


class DenseTable(AppendTable):
    """An :class:`AppendTable` made with ``dense=True`` whose rows can be read a batch at a time."""

    def __init__(self, segment: Segment, base: int = 0) -> None:
        super().__init__(segment, base)
        rows_off = self.base + HEADER_BYTES
        self._rows = segment.array(np.int64, rows_off, self.rows * ROW_WORDS).reshape(self.rows, ROW_WORDS)
        self._read_only = segment.buf.toreadonly()  # its slices are read-only views as made

    def close(self) -> None:
        self._read_only.release()
        self._read_only, self._rows = memoryview(b""), np.empty((0, ROW_WORDS), np.int64)
        super().close()

    def get_rows(self, rows: npt.ArrayLike, *, copy: bool = False) -> list[Any]:
        """:meth:`get` of the key of each of ``rows`` (row ``k`` holds key ``(k + 1, 0)``), in one pass.

        The rows are read in one NumPy gather; a row already checked (by this process, or on x86-64 by any:
        its mark) is served at once as a read-only view, a key not there is None, and a row no reader
        has checked yet is checked as :meth:`get` checks it (bounds, then the CRC; a torn one is None and
        counted in ``torn_reads``). ``copy``: each value as ``bytes`` (sliced from the mapping: one copy,
        no view made first), for a reader that would copy the view anyway.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if not self.dense:
            raise ValueError(f"{self.segment.path}: get_rows reads a dense table (keys are rows + 1)")
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= self.rows):
            bad = int(rows[(rows < 0) | (rows >= self.rows)][0])
            raise KeyError(f"key {bad} is outside the table's 0..{self.rows - 1}")
        words = self._rows[rows]  # one copy of the batch's rows: key, hi, offset, length, check
        check = words[:, 4]
        present = (words[:, 0] == rows + 1) & (check != 0)
        # A checked row's offset and length are those its check covered: fixed for good (never overwritten).
        if self._checked is None:
            checked = np.zeros(len(rows), bool)
        else:
            checked = np.frombuffer(self._checked, bool)[rows]
        if _table._SHARED_MARKS:
            checked |= (check & _table._CHECKED_MARK) != 0
        starts = words[:, 2] + self._data_off
        ends = (starts + words[:, 3]).tolist()
        buf: Any = self._read_only.obj if copy else self._read_only  # the mmap: a slice of it is bytes
        out: list[Any] = [
            buf[start:end] if ok else None
            for ok, start, end in zip((present & checked).tolist(), starts.tolist(), ends, strict=True)
        ]
        for k in np.flatnonzero(present & ~checked).tolist():  # rows no reader has checked yet
            out[k] = self._checked_value(int(rows[k]), words[k], copy)
        return out

    def _checked_value(self, row: int, words: np.ndarray, copy: bool) -> Any:
        """:meth:`get`'s check of ``row`` (its words as gathered): the value if its bounds hold and its bytes
        match the row's check (then marked checked), else None (a torn read, counted)."""
        lo, offset, length, check = (int(w) for w in words[[0, 2, 3, 4]])
        if not 0 <= offset <= offset + length <= self.data_bytes:
            self.torn_reads += 1
            return None
        start = self._data_off + offset
        view = self._read_only[start : start + length]
        if _table._check(lo, 0, view) != check & ~_table._CHECKED_MARK:
            self.torn_reads += 1
            return None
        if _table._SHARED_MARKS and not check & _table._CHECKED_MARK:
            # one aligned 8-byte store; readers racing here store the same value
            self._row_words[ROW_WORDS * row + 4] = check | _table._CHECKED_MARK
        self._mark_checked(row)
        return bytes(view) if copy else view
