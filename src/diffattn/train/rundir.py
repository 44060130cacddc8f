"""The rules of a run directory: what a new run may train into, and what it finds there when it starts.

    check_run_dir(run_dir, resume=None, overwrite=False)   # refuses a folder holding files, before anything is written
    replaced = prepare_run_dir(run_dir, overwrite=False, fresh=True)
    write_run_config(run_dir, cfg)                         # config.yaml: what rebuilds the run

A run directory is never replaced by accident: training into one that already holds files needs ``resume`` (continue
it) or ``overwrite`` (replace a previous run, which must be one: it holds ``config.yaml``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RunExistsError, UsageError
from ..io import atomic_write_file, remove_dir
from .config import TrainConfig, run_config_dict

__all__ = ["CONFIG_FILE", "check_run_dir", "prepare_run_dir", "write_run_config"]

#: the file that makes a folder a run directory: the run's config (:func:`~diffattn.train.config.run_config_dict`)
CONFIG_FILE = "config.yaml"
#: what a fresh start (step 0) drops from a previous run in the same directory: its TensorBoard logs and best model
STALE_ON_FRESH_START = ("tensorboard", "best")


def check_run_dir(run_dir: Path, resume: str | None, overwrite: bool) -> None:
    """Refuse to train into ``run_dir`` when that would replace files by accident: it holds anything and neither
    ``resume`` nor ``overwrite`` is given; ``overwrite`` of a directory that is not a run (no ``config.yaml``);
    ``resume`` together with ``overwrite``; a file where the directory should be."""
    if resume is not None and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: continue the run, or replace it")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"run directory {str(run_dir)!r} is a file; give --out a folder")
    if resume is not None or not run_dir.is_dir():
        return
    entries = sorted(p.name for p in run_dir.iterdir())
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:4]) + (", …" if len(entries) > 4 else "")
        raise RunExistsError(f"run directory {str(run_dir)!r} is not empty ({shown}); continue the run with "
                             f"--resume auto, replace it with --overwrite, or choose another --out")
    leftovers = all(e.startswith(".") and e.endswith(".tmp") for e in entries)  # a run killed before config.yaml
    if not (run_dir / CONFIG_FILE).is_file() and not leftovers:
        raise UsageError(f"--overwrite replaces a previous run, but {str(run_dir)!r} holds no config.yaml (it is not a "
                         f"run directory) and is not empty; choose another --out")


def prepare_run_dir(run_dir: Path, *, overwrite: bool, fresh: bool) -> bool:
    """Rank 0's part before a run writes into ``run_dir`` (checked by :func:`check_run_dir`): with ``overwrite`` the
    previous run is removed; the directory is created; a ``fresh`` start (step 0: a new run, or ``resume auto``
    without a checkpoint) drops what a previous run left there (:data:`STALE_ON_FRESH_START`). Returns whether a
    previous run was replaced."""
    replaced = overwrite and run_dir.is_dir()
    if replaced:
        remove_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in STALE_ON_FRESH_START if fresh else ():
        if (run_dir / stale).is_dir():
            remove_dir(run_dir / stale)
    return replaced


def write_run_config(run_dir: Path, cfg: TrainConfig) -> None:
    """``run_dir/config.yaml``: every section of ``cfg`` (:func:`~diffattn.train.config.run_config_dict`), written
    atomically; loading it back gives ``cfg`` again."""
    import yaml

    with atomic_write_file(run_dir / CONFIG_FILE, "w") as f:
        yaml.safe_dump(run_config_dict(cfg), f, sort_keys=False)
