"""Progress reporting that suits where the output goes.

On a terminal :func:`progress` is a tqdm bar. Where the stream is not a terminal (a log file, a pipe, ``make demo
> log``) a bar would write every refresh as another line, so it prints one plain line every ``every`` seconds
instead (and one at the end): ``desc: 120/600 steps (20%) 1.9 steps/s ETA 4m12s loss=2.1``.

:func:`library_bars` makes the bars of transformers and huggingface_hub ("Loading weights", "Writing model shards",
downloads) follow the same rule; the ``diffattn`` command calls it once at its entry (importing this module changes
nothing).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["progress", "LineProgress", "is_terminal", "library_bars"]

#: seconds between two lines where the output is not a terminal (``DIFFATTN_PROGRESS_EVERY`` changes it)
DEFAULT_EVERY = 30.0


def is_terminal(stream: IO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class LineProgress:
    """tqdm's interface (``update``, ``set_postfix``, ``write``, ``close``, iteration) printing a line every
    ``every`` seconds."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, initial: int = 0,
                 desc: str | None = None, unit: str = "it", file: IO | None = None, every: float | None = None,
                 disable: bool = False) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.start_n = total, initial, initial
        self.desc, self.unit, self.file, self.disable = desc, unit, file or sys.stderr, disable
        if every is None:
            every = float(os.environ.get("DIFFATTN_PROGRESS_EVERY", DEFAULT_EVERY))
        self.every = every
        self.postfix = ""
        self.t0 = self.last = time.monotonic()
        self.last_n = initial
        self.closed = False

    def _line(self) -> str:
        done = self.n - self.start_n
        dt = time.monotonic() - self.t0
        rate = done / dt if dt > 0 else 0.0
        parts = [f"{self.desc}:" if self.desc else None]
        if self.total:
            parts.append(f"{self.n}/{self.total} {self.unit}s ({100 * self.n / self.total:.0f}%)")
        else:
            parts.append(f"{self.n} {self.unit}s")
        parts.append(f"{rate:.2f} {self.unit}s/s" if rate else None)
        if self.total and rate:
            parts.append(f"ETA {_duration((self.total - self.n) / rate)}")
        parts.append(self.postfix or None)
        return " ".join(p for p in parts if p)

    def _emit(self) -> None:
        print(self._line(), file=self.file, flush=True)
        self.last, self.last_n = time.monotonic(), self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.disable and time.monotonic() - self.last >= self.every:
            self._emit()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = " ".join(f"{k}={v}" for k, v in items.items())

    def write(self, s: str, file: IO | None = None) -> None:
        """Print a line (also when the bar is disabled, as ``tqdm.write`` does)."""
        print(s, file=file or self.file, flush=True)

    def close(self) -> None:
        if not self.closed and not self.disable and self.n > self.last_n:  # the final count, once
            self._emit()
        self.closed = True

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Iterable | None = None, *, total: int | None = None, initial: int = 0,
             desc: str | None = None, unit: str = "it", disable: bool = False, file: IO | None = None,
             leave: bool = True, every: float | None = None, **tqdm_kwargs: Any):
    """A tqdm bar on a terminal, else a :class:`LineProgress` (a line every ``every`` seconds); ``disable``
    silences both."""
    file = file or sys.stderr
    if disable or not is_terminal(file):
        return LineProgress(iterable, total=total, initial=initial, desc=desc, unit=unit, file=file, every=every,
                            disable=disable)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, file=file, leave=leave,
                dynamic_ncols=True, **tqdm_kwargs)


def library_bars(enabled: bool = True, file: IO | None = None) -> bool:
    """Apply diffattn's rule to the progress bars of transformers and huggingface_hub: where diffattn draws no bar
    (``enabled=False``, e.g. ``--no-progress``, or ``file``, default stderr, is not a terminal) they draw none either,
    instead of writing every refresh of "Loading weights" or "Writing model shards" into a log file. Returns whether
    bars stay on.

    Through the libraries' own switches: ``huggingface_hub.utils.disable_progress_bars()`` (a light import; a
    transformers imported later starts with its bars off, as it reads that switch) and, when transformers is already
    imported, ``transformers.utils.logging.disable_progress_bar()``. Bars are never switched back on here; the
    environment is left as it is (a user's ``HF_HUB_DISABLE_PROGRESS_BARS`` keeps its meaning)."""
    if enabled and is_terminal(file or sys.stderr):
        return True
    import importlib.util

    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

        if not are_progress_bars_disabled():
            disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return False
