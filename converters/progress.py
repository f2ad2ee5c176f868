"""A progress bar with rate and ETA on stderr: tqdm's when tqdm is installed, else a plain one.

``voc2coco`` shows it when asked (``progress=True``), or by default (``progress=None``) when
stderr is a terminal and the dataset is large; ``--quiet`` and ``--no-progress`` turn it off.
The plain bar rewrites one line (``\\r``) at most every :data:`Progress.INTERVAL` seconds::

    voc2coco:  42% 420000/1000000 xml, 61234 xml/s, ETA 0:00:09

and ends it with a newline. The counts are XML files parsed (a file read for its label names
only counts too).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """Counts ``total`` steps; ``update(n)`` after each ``n`` done, ``close()`` at the end.

    ``enabled=False`` makes every call free. ``use_tqdm``: ``None`` uses tqdm when it can be
    imported, ``False`` always the plain bar. ``stream``: stderr by default.
    """

    INTERVAL = 0.5

    def __init__(self, total: int, enabled: bool, *, desc: str = "voc2coco", unit: str = "xml",
                 stream: TextIO | None = None, use_tqdm: bool | None = None) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        self._start = self._last = time.monotonic()
        if enabled and use_tqdm is not False:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream,
                                 mininterval=self.INTERVAL, smoothing=0.1)

    def update(self, n: int = 1) -> None:
        if not self.enabled:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.INTERVAL or self.done >= self.total:
            self._last = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The plain bar's text (no ``\\r``): percentage, counts, rate and ETA."""
        elapsed = (now if now is not None else time.monotonic()) - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        pct = 100 * self.done // self.total if self.total else 100
        if rate > 0 and self.total >= self.done:
            eta = _clock((self.total - self.done) / rate)
        else:
            eta = "?"
        return (f"{self.desc}: {pct:3d}% {self.done}/{self.total} {self.unit}, "
                f"{rate:.0f} {self.unit}/s, ETA {eta}")

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()
        self.enabled = False


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
