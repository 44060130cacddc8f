"""The measured table behind ``backend="auto"``'s choice between the fused Triton kernel and the ``sdpa`` backend on
a GPU (``dispatch.json``, package data): per device name, dtype and value width, the key count below which the
kernel runs. ``benchmarks/gpu_goals.py core --dispatch-out`` writes it from timings of both paths on the card
(:func:`entries_from_core_rows`); a card the table does not name gets the entries marked ``default``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

__all__ = ["DispatchEntry", "device_name", "triton_rule", "entries_from_core_rows", "load_table", "merge_entries"]

FORMAT = 1


@dataclass(frozen=True)
class DispatchEntry:
    device: str
    dtype: str
    value_width: int
    triton_below_keys: int | None  # None: at every length
    measured: str
    default: bool = False

    def prefers_triton(self, nk: int) -> bool:
        return self.triton_below_keys is None or nk < self.triton_below_keys


def load_table(path: str | Path | None = None) -> list[DispatchEntry]:
    """The entries of a dispatch table (the packaged one by default); a malformed file raises naming the field."""
    text = (Path(path).read_text(encoding="utf-8") if path is not None
            else resources.files("diffattn.ops").joinpath("dispatch.json").read_text(encoding="utf-8"))
    data = json.loads(text)
    if data.get("format") != FORMAT:
        raise ValueError(f"dispatch table format must be {FORMAT}, got {data.get('format')!r}")
    out = []
    for i, e in enumerate(data.get("entries", [])):
        try:
            below = e["triton_below_keys"]
            if below is not None and (not isinstance(below, int) or below < 1):
                raise ValueError(f"triton_below_keys must be null or an integer >= 1, got {below!r}")
            out.append(DispatchEntry(str(e["device"]), str(e["dtype"]), int(e["value_width"]), below,
                                     str(e.get("measured", "")), bool(e.get("default", False))))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"dispatch table entry {i}: {err}") from err
    return out


@functools.cache
def _packaged() -> tuple[DispatchEntry, ...]:
    return tuple(load_table())


@functools.cache
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device: torch.device) -> str:
    """The name the table keys a device by: the CUDA card's name, else the device type (read once per card)."""
    if device.type != "cuda":
        return device.type
    return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())


def triton_rule(device: torch.device, dtype: torch.dtype, value_width: int) -> DispatchEntry | None:
    """The table entry that decides for this device, dtype and value width: the device's own (same dtype first),
    else a default one for the width; None when no entry names the width (then value widths up to 128 take the
    kernel, as on the measured cards)."""
    return _rule(device_name(device), str(dtype).removeprefix("torch."), value_width)


@functools.cache
def _rule(name: str, dt: str, value_width: int) -> DispatchEntry | None:
    """:func:`triton_rule` by device name and dtype text, looked up once per combination."""
    entries = [e for e in _packaged() if e.value_width == value_width]
    for match in (lambda e: e.device == name and e.dtype == dt, lambda e: e.device == name,
                  lambda e: e.default and e.dtype == dt, lambda e: e.default):
        found = [e for e in entries if match(e)]
        if found:
            return found[0]
    return None


def entries_from_core_rows(rows: list[dict], device: str, dtype: str, measured: str) -> list[dict]:
    """Table entries from ``benchmarks/gpu_goals.py core`` rows (methods ``diff_triton`` and ``diff_sdpa``, forward
    + backward ms per sequence length, head width d → value width 2d, causal and not): per value width, the kernel
    runs below the shortest length at which it was slower than the ``sdpa`` backend in either mask mode (null when
    it never was). Widths where either path failed at some length are left out."""
    by_width: dict[int, dict[tuple[int, bool], dict[str, float]]] = {}
    failed: set[int] = set()
    for r in rows:
        if r.get("method") not in ("diff_triton", "diff_sdpa"):
            continue
        width = 2 * int(r["head_dim"])
        if "fwd_bwd_ms" not in r:
            failed.add(width)
            continue
        by_width.setdefault(width, {}).setdefault((int(r["seqlen"]), bool(r["causal"])), {})[r["method"]] = \
            float(r["fwd_bwd_ms"])
    out = []
    for width, cells in sorted(by_width.items()):
        if width in failed or any(len(c) != 2 for c in cells.values()):
            continue
        slower = sorted(n for (n, _), c in cells.items() if c["diff_triton"] > c["diff_sdpa"])
        out.append(dict(device=device, dtype=dtype, value_width=width,
                        triton_below_keys=slower[0] if slower else None, measured=measured))
    return out


def merge_entries(path: str | Path | None, new: list[dict]) -> dict:
    """The table at ``path`` (the packaged one when None or missing) with ``new`` entries replacing those of the same
    device, dtype and value width (a replaced ``default`` entry's successor stays the default)."""
    text = (Path(path).read_text(encoding="utf-8") if path is not None and Path(path).exists()
            else resources.files("diffattn.ops").joinpath("dispatch.json").read_text(encoding="utf-8"))
    data = json.loads(text)

    def key(e: dict) -> tuple:
        return e["device"], e["dtype"], int(e["value_width"])

    old = {key(e): e for e in data.get("entries", [])}
    for e in new:
        e = dict(e)
        if old.get(key(e), {}).get("default"):
            e["default"] = True
        old[key(e)] = e
    data["entries"] = list(old.values())
    return data
