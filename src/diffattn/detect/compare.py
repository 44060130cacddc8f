"""Deprecated: the detection comparison is the study :mod:`diffattn.studies.detection` (``diffattn study
detection``; ``python -m diffattn.detect.compare`` is gone). Its names still resolve here, with a
DeprecationWarning naming the new place."""

from __future__ import annotations

import importlib
import warnings

#: old name -> the same function in diffattn.studies.detection (looked up by name: detect is library code and
#: imports no study)
_MOVED = ("run_compare", "summarize", "train_one", "plot_maps", "DEFAULT_MODELS")


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(f"diffattn.detect.compare.{name} is deprecated; use diffattn.studies.detection.{name} "
                      f"(the command: diffattn study detection)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("diffattn.studies.detection"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
