"""Progress of long loops: a tqdm bar on a terminal, plain lines in a log.

A bar redraws itself with carriage returns, which fill a log file with unreadable lines; a log gets instead one
plain line at most every ``interval`` seconds (count, rate, the loop's own values such as the loss, elapsed time
and the time left; default 30 s, or ``PAPE_HUB_PROGRESS_INTERVAL``), and nothing at all from a loop that ends
sooner.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["INTERVAL_VARIABLE", "Progress", "duration"]

#: seconds between two lines in a log (default 30)
INTERVAL_VARIABLE = "PAPE_HUB_PROGRESS_INTERVAL"


def duration(seconds: float) -> str:
    """``75.4`` -> ``"1 min 15 s"``; under a minute ``"42 s"``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class Progress:
    """Iterate ``iterable`` (or count ``update`` calls up to ``total``) with a bar on a terminal (``stream``,
    default stderr) and plain lines on ``log`` (default stdout) otherwise. ``enabled=False``: silent."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "",
                 enabled: bool = True, interval: float | None = None, unit: str = "it", stream: TextIO | None = None,
                 log: TextIO | None = None) -> None:
        self.iterable, self.desc, self.enabled, self.unit = iterable, desc, enabled, unit
        self.interval = float(os.environ.get(INTERVAL_VARIABLE, 30.0)) if interval is None else interval
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        stream = stream or sys.stderr
        self.log = log or sys.stdout
        self.bar = None
        if enabled and stream.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=desc, leave=False, file=stream, unit=unit)
        self.count, self.values = 0, {}
        self.started = self.last = time.monotonic()

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def set_postfix(self, **values: Any) -> None:
        """Values the next line (or the bar) shows, e.g. ``loss="0.693"``."""
        self.values = values
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)

    def update(self, n: int = 1) -> None:
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= self.interval:
            self.last = now
            print(self.line(now), file=self.log, flush=True)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        rate = self.count / elapsed if elapsed > 0 else 0.0
        done = f"{self.count}/{self.total}" if self.total else str(self.count)
        left = f", {duration((self.total - self.count) / rate)} left" if self.total and rate > 0 else ""
        values = "".join(f", {k} {v}" for k, v in self.values.items())
        return f"  {self.desc}: {done} {self.unit}{values}, {rate:.1f} {self.unit}/s, {duration(elapsed)}{left}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
