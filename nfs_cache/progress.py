"""Progress of a long command: a live bar on a terminal, a plain line every few seconds anywhere else.

Why both: a bar redraws itself with carriage returns, which is right on a terminal and garbage in a CI log, a
pipe or a file (thousands of overwritten lines in one). Off a terminal, a line such as
``staging 1200 files: 350/1200 files (29%), 12 s, 29 files/s`` every ``interval_s`` seconds says the same and reads
well in a log. Used by ``coordl stage``, ``coordl synth`` and ``coordl demo`` (it lives here, the lowest package
with a long command, so that all of them can import it).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress"]


def _fmt(value: float, scale: bool) -> str:
    if not scale:
        return f"{value:.0f}"
    for unit in ("", "k", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{value:.1f}{unit}" if unit else f"{value:.0f}"
        value /= 1000
    return f"{value:.1f}P"


class Progress:
    """Counts work done out of ``total``; shows it on ``file`` (default stderr) unless ``enabled`` is False.

    Args:
        total: amount of work (items, bytes).
        desc: what is being done, e.g. ``"synthesising 2000 images"``.
        unit: what ``total`` counts (``"images"``, ``"B"``).
        unit_scale: show 1.2M rather than 1200000 (bytes).
        interval_s: seconds between plain lines off a terminal (a terminal bar redraws as tqdm decides).
        terminal: force the bar (True) or plain lines (False); None: ``file.isatty()``.
    """

    def __init__(
        self,
        total: float,
        desc: str,
        *,
        unit: str = "items",
        unit_scale: bool = False,
        file: TextIO | None = None,
        interval_s: float = 5.0,
        enabled: bool = True,
        terminal: bool | None = None,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.unit_scale = unit_scale
        self.file = file if file is not None else sys.stderr
        self.interval_s = interval_s
        self.enabled = enabled
        self.n: float = 0
        self._start = self._last = time.monotonic()
        self._bar: Any = None
        if terminal is None:
            isatty = getattr(self.file, "isatty", None)
            terminal = bool(isatty and isatty())
        if enabled and terminal:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=self.file)

    def update(self, amount: float = 1) -> None:
        self.set(self.n + amount)

    def set(self, done: float, **postfix: Any) -> None:
        """Record that ``done`` (absolute) is done; ``postfix`` adds ``name=value`` to the display."""
        self.n = done
        if not self.enabled:
            return
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(done - self._bar.n)  # tqdm redraws at most every 0.1 s
            return
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._line(postfix)

    def _line(self, postfix: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self._start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = f", {_fmt(self.n / elapsed, self.unit_scale)} {self.unit}/s" if elapsed > 0 else ""
        extra = "".join(f", {k} {v}" for k, v in postfix.items())
        done, total = _fmt(self.n, self.unit_scale), _fmt(self.total, self.unit_scale)
        print(f"{self.desc}: {done}/{total} {self.unit}{pct}, {elapsed:.0f} s{rate}{extra}", file=self.file)
        self.file.flush()

    def close(self) -> None:
        """End the display (a final plain line off a terminal, when anything was shown or it took a while)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and time.monotonic() - self._start >= self.interval_s:
            self._line({})
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
