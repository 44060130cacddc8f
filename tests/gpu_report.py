"""Measured numbers of the GPU tests, written where a GPU run wants them.

When the environment variable ``DIFFATTN_GPU_REPORT`` names a file, :func:`record` appends one JSON line to it
(safe from several pytest-xdist workers: each line is one small append). ``benchmarks/gpu_check.py`` sets it and
renders the lines into docs/benchmarks.md, so the errors quoted there are the ones the asserting tests measured.
"""

from __future__ import annotations

import json
import os


def record(kind: str, name: str, **values) -> None:
    """Append ``{"kind": kind, "name": name, **values}`` to $DIFFATTN_GPU_REPORT when it is set."""
    path = os.environ.get("DIFFATTN_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(kind=kind, name=name, **values)) + "\n")
