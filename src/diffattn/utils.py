"""Small utilities shared by tests and benchmarks."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["peak_memory_mb"]


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Peak resident memory (MiB) that ``fn()`` adds on the CPU, or None where it cannot be measured.

    Resets the kernel's high-water mark (Linux: writing 5 to /proc/self/clear_refs), runs ``fn`` and reads VmHWM
    minus the resident size before the call. The result of ``fn`` is dropped before returning.
    """
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return None
    before = _status_kb("VmRSS")
    out = fn()
    peak = _status_kb("VmHWM")
    del out
    return max(peak - before, 0) / 1024
