"""Small utilities shared by tests and benchmarks."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["peak_memory_mb", "MALLOC_ENV"]

# glibc keeps freed blocks resident once its dynamic mmap threshold has grown, which hides later peaks from the
# RSS high-water mark; a fixed threshold returns every large block to the OS on free. Set it before the process
# starts (benchmarks and the memory test run their measurements in a child process with this environment).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Peak resident memory (MiB) that ``fn()`` adds on the CPU, or None where it cannot be measured.

    Resets the kernel's high-water mark (Linux: writing 5 to /proc/self/clear_refs), runs ``fn`` and reads VmHWM
    minus the resident size before the call. The result of ``fn`` is dropped before returning. Exact only in a
    process started with :data:`MALLOC_ENV`.
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
