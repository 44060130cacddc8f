"""Small utilities shared by the commands, tests and benchmarks: the device a command runs on
(:func:`check_device`, :func:`resolve_device`), the memory it can use (:func:`available_memory`), peak memory of a
call, the CPU's name, results sections in markdown files, the ops a call dispatches (:func:`count_ops`)."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import UsageError

__all__ = ["peak_memory_mb", "MALLOC_ENV", "cpu_name", "write_markdown_section", "check_device", "resolve_device",
           "available_memory", "format_bytes", "DEVICE_VALUES", "device_errors", "count_ops"]

#: what ``run.device`` / ``--device`` take (null / not given: ``cuda`` when torch sees a GPU, else ``cpu``)
DEVICE_VALUES = "'cpu', 'cuda' or 'cuda:N'"
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_device(value: object, what: str = "--device") -> str | None:
    """``value`` if it is a device name :func:`resolve_device` takes (``cpu``, ``cuda``, ``cuda:N``) or None;
    otherwise a :class:`~diffattn.errors.UsageError` naming ``what``. Checks the spelling only, not the hardware."""
    if value is None or (isinstance(value, str) and _DEVICE.match(value)):
        return value
    raise UsageError(f"{what} must be {DEVICE_VALUES}, got {value!r}")


def device_errors(cfg, where: str, key: str = "device") -> list[str]:
    """The spelling check of :func:`check_device` on ``cfg[key]`` (a study config's device) as a list of error
    messages naming the key and ``where``: empty when it is None or a device name."""
    try:
        check_device(cfg[key], f"{key} in {where}")
    except UsageError as e:
        return [str(e)]
    return []


def resolve_device(value: str | None, what: str = "--device", *, local_rank: int = 0,
                   world_size: int = 1) -> torch.device:
    """The device ``value`` names, checked against what torch sees (``CUDA_VISIBLE_DEVICES`` applies):

    - None: ``cuda:<local_rank>`` when CUDA is available, else ``cpu`` (one GPU per torchrun process);
    - ``cpu``; ``cuda``: ``cuda:<local_rank>``; ``cuda:N``: GPU N (one process only: under torchrun each process
      takes its local rank's GPU, so ``cuda:N`` cannot name them all).

    A bad spelling, CUDA where torch sees no GPU, or a GPU index beyond those it sees is a
    :class:`~diffattn.errors.UsageError` naming ``what``."""
    value = check_device(value, what)
    if value is None:
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if value == "cpu":
        return torch.device("cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not torch.cuda.is_available():
        raise UsageError(f"{what} {value!r} needs a CUDA GPU, but torch sees none{seen}; use {what} cpu")
    index = local_rank if value == "cuda" else int(value.split(":")[1])
    if value != "cuda" and world_size > 1:
        raise UsageError(f"{what} {value!r} names one GPU, but torchrun started {world_size} processes; use {what} "
                         f"cuda (each process takes the GPU of its LOCAL_RANK) and choose the GPUs with "
                         f"CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(f"{what} {value!r}: torch sees {count} CUDA GPU{'s' if count != 1 else ''} "
                         f"(cuda:0 to cuda:{count - 1}){seen}")
    return torch.device("cuda", index)


def _meminfo_bytes(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_room() -> int | None:
    """Bytes the process's cgroup (v2, else v1) still allows: its limit minus its usage; None without a limit."""
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            with open(limit, encoding="ascii") as f:
                text = f.read().strip()
            with open(usage, encoding="ascii") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if text == "max" or not text.isdigit() or int(text) >= 1 << 60:
            return None
        return max(int(text) - used, 0)
    return None


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation on ``device`` can take now: for a CUDA device its free memory
    (``torch.cuda.mem_get_info``); for the CPU the smaller of ``MemAvailable`` (/proc/meminfo, or psutil) and
    what the cgroup's memory limit leaves. None where it cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = _meminfo_bytes("MemAvailable")
    if free is None:
        try:
            import psutil
        except ImportError:
            psutil = None
        if psutil is not None:
            free = int(psutil.virtual_memory().available)
    room = _cgroup_room()
    known = [b for b in (free, room) if b is not None]
    return min(known) if known else None


def format_bytes(n: float) -> str:
    """``n`` bytes as ``"1.5 GB"`` (decimal units, as memory sizes are quoted)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


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
