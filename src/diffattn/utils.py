"""Small utilities shared by tests and benchmarks."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path

__all__ = ["peak_memory_mb", "MALLOC_ENV", "cpu_name", "write_markdown_section", "count_ops"]

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


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def write_markdown_section(path: str | Path, key: str, text: str) -> None:
    """Replace the text between ``<!-- key:begin -->`` and ``<!-- key:end -->`` in ``path``; append the marked
    section if it is absent. Results docs are rewritten by the scripts that measure them, never by hand."""
    path = Path(path)
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{text.rstrip(chr(10))}\n{end}"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old and old.index(begin) < old.index(end):
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def count_ops(fn: Callable[[], object]) -> dict[str, int]:
    """The aten ops that ``fn()`` dispatches, views excluded, by name: the host cost of eager PyTorch code, which
    on a GPU bounds the speed of small models (each op is a launch). Counted with a ``TorchDispatchMode``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: dict[str, int] = {}

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                name = func.overloadpacket.__name__
                ops[name] = ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with _Counter():
        fn()
    return ops
