"""Checkpoints that lose nothing: model, optimizer, scheduler, grad scaler, EMA, every rank's RNG states and the
step (which fixes the data position, see :class:`~diffattn.train.data.StepBatchSampler`), written atomically
(one directory swapped into place) by rank 0, the last k kept, loaded with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io import atomic_write_dir, recover_dir

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "latest_checkpoint", "load_checkpoint",
           "resolve_resume", "checkpoint_dirs"]

STATE_FILE = "state.pt"
_NAME = re.compile(r"^step_(\d{8})$")


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, every CUDA device, numpy, Python) as tensors and plain values."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                      "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
            "python": list(random.getstate()[1]) + [random.getstate()[2]]}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    py = state["python"]
    random.setstate((3, tuple(py[:-1]), py[-1]))


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``run_dir/checkpoints``, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        if _NAME.match(p.name):
            recover_dir(p)
            if (p / STATE_FILE).is_file():
                out.append(p)
    return sorted(out, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write ``state`` to ``run_dir/checkpoints/step_<step>/state.pt`` atomically and delete all but the newest
    ``keep_last`` checkpoints. Call on rank 0 only."""
    target = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    with atomic_write_dir(target) as tmp:
        torch.save(state, Path(tmp) / STATE_FILE)
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint` (``path`` is the ``step_…`` directory)."""
    path = Path(path)
    recover_dir(path)
    f = path / STATE_FILE
    if not f.is_file():
        raise ValueError(f"--resume {str(path)!r}: no {STATE_FILE} there; give a checkpoints/step_* directory, a "
                         f"run directory or 'auto'")
    return torch.load(f, map_location="cpu", weights_only=True)


def resolve_resume(resume: str | None, run_dir: str | Path) -> Path | None:
    """``None`` → fresh run; ``auto`` → the newest checkpoint of ``run_dir`` (fresh if none); a run directory →
    its newest checkpoint; a ``step_…`` directory → itself."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    p = Path(resume)
    if (p / STATE_FILE).is_file():
        return p
    if p.is_dir() and (latest := latest_checkpoint(p)) is not None:
        return latest
    raise ValueError(f"--resume {resume!r} is neither 'auto', a checkpoint directory nor a run directory with "
                     f"checkpoints")
