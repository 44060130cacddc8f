"""Checkpoints that lose nothing: model, optimizer, scheduler, grad scaler, EMA, every rank's RNG states and the
step (which fixes the data position, see :class:`~diffattn.train.data.StepBatchSampler`), written atomically
(one directory swapped into place) by rank 0, the last k kept, loaded with ``torch.load(weights_only=True)``.

Resuming with ``auto`` (or from a run directory) takes the newest checkpoint that reads back whole: one that is
truncated or damaged (a disk filled up, a file copied in part) is skipped, and the caller is told which and why."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import UsageError
from ..io import atomic_write_dir, load_torch_file, recover_dir
from .distributed import DistEnv

__all__ = ["rng_state", "set_rng_state", "gather_rng", "full_state", "load_full_state", "save_checkpoint",
           "latest_checkpoint", "load_checkpoint", "resolve_resume", "find_resume", "checkpoint_dirs"]

STATE_FILE = "state.pt"
_NAME = re.compile(r"^step_(\d{8})$")
#: what every checkpoint holds
STATE_KEYS = ("step", "world_size", "config", "model", "optimizer", "scheduler", "scaler", "rng")


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


def gather_rng(env: DistEnv) -> list[dict]:
    """Every rank's :func:`rng_state`, in rank order (on every rank; one process: its own)."""
    state = rng_state()
    if not env.distributed:
        return [state]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, state)
    return out


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts on CPU, keyed by parameter names (DDP and FSDP2 alike)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load the state dicts of :func:`full_state` into ``model`` and ``optimizer`` (sharded or not), strictly."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True, strict=True))


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``run_dir/checkpoints``, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    out = []
    for p in list(folder.iterdir()):
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
    """The state saved by :func:`save_checkpoint` (``path`` is the ``step_…`` directory). A missing, truncated or
    damaged ``state.pt``, or one that lacks an entry of :data:`STATE_KEYS`, is a ``ValueError`` naming the file."""
    path = Path(path)
    recover_dir(path)
    f = path / STATE_FILE
    if not f.is_file():
        raise UsageError(f"{path}: no {STATE_FILE} there; give a checkpoints/step_* directory, a run directory or "
                         f"'auto'")
    state = load_torch_file(f)
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{f} is not a diffattn training checkpoint (it lacks {missing})")
    return state


def find_resume(resume: str | None, run_dir: str | Path) -> tuple[Path | None, dict | None, list[tuple[Path, str]]]:
    """The checkpoint to resume from: ``(its directory, its state, [(skipped checkpoint, why), …])``.

    ``None`` → a fresh run ``(None, None, [])``; ``auto`` → the newest intact checkpoint of ``run_dir`` (a fresh
    run if it has none); a run directory → its newest intact checkpoint; a ``step_…`` directory → itself.
    Damaged checkpoints are skipped, newest first, and listed; when every one is damaged, or the one named
    explicitly is, or ``resume`` names nothing, a :class:`UsageError` says so."""
    if resume is None:
        return None, None, []
    p = Path(resume)
    if resume == "auto":
        candidates = checkpoint_dirs(run_dir)[::-1]
    elif (p / STATE_FILE).is_file():
        try:
            return p, load_checkpoint(p), []
        except ValueError as e:
            raise UsageError(f"--resume {resume}: {e}") from e
    elif p.is_dir() and checkpoint_dirs(p):
        candidates = checkpoint_dirs(p)[::-1]
    else:
        raise UsageError(f"--resume {resume!r} is neither 'auto', a checkpoint directory (with {STATE_FILE}) nor a "
                         f"run directory with checkpoints")
    skipped: list[tuple[Path, str]] = []
    for c in candidates:
        try:
            return c, load_checkpoint(c), skipped
        except ValueError as e:
            skipped.append((c, str(e)))
    if skipped:
        raise UsageError(f"--resume {resume}: no intact checkpoint: " + "; ".join(why for _, why in skipped))
    return None, None, []


def resolve_resume(resume: str | None, run_dir: str | Path) -> Path | None:
    """The directory of the checkpoint :func:`find_resume` picks (None for a fresh run)."""
    return find_resume(resume, run_dir)[0]
