"""The old home of the fused Triton kernels, now :mod:`diffattn.ops.kernels`: reading a name here warns (the rows
``diffattn.kernels.*`` of :data:`diffattn.deprecations.DEPRECATIONS`) and returns the one from there. Importing this
module imports neither triton nor the kernels."""

from __future__ import annotations

import importlib

from .deprecations import moved_attribute

__all__: list[str] = []


def _kernels(name: str):
    """A getter of ``name`` from :mod:`diffattn.ops.kernels` (which imports triton), imported when read."""
    return lambda: getattr(importlib.import_module("diffattn.ops.kernels"), name)


__getattr__ = moved_attribute("diffattn.kernels", {
    "triton_diff_attention": _kernels("triton_diff_attention"),
    "triton_unsupported_reason": _kernels("triton_unsupported_reason"),
    "triton_diff": lambda: importlib.import_module("diffattn.ops.kernels.triton_diff"),
})
