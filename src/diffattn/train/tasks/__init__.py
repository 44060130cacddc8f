"""Training recipes, one class per task, listed once in :data:`TASKS`; :func:`build_task` picks one from a config.
Each class declares the ``task`` keys it reads (:attr:`Task.options`)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import warnings
from typing import Any

from ..config import RESUMABLE_KEYS, TASKS, EvalConfig, TrainConfig
from .base import Task, mean_lambdas

__all__ = ["Task", "build_task", "mean_lambdas", "TASKS", "task_class", "task_options", "task_keys", "run_config_dict",
           "config_digest"]

def task_class(name: str) -> type[Task]:
    """The recipe class of task ``name`` (ValueError naming the valid ones)."""
    if name not in TASKS:
        raise ValueError(f"task.name must be one of {sorted(TASKS)}, got {name!r}")
    return getattr(importlib.import_module(TASKS[name][0]), TASKS[name][1])


def task_options(name: str) -> tuple[str, ...] | None:
    """The ``task`` keys task ``name`` reads (its class's ``options``); None for a name that is no task."""
    return task_class(name).options if name in TASKS else None


def build_task(cfg: TrainConfig) -> Task:
    """The recipe named by ``cfg.task.name``."""
    return task_class(cfg.task.name)(cfg)


def run_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config a run records in ``config.yaml``: every section, with only the ``task`` keys its task reads
    (:func:`task_keys`). Loading it back gives ``cfg`` again (the left-out keys are at their defaults and unused)."""
    d = cfg.to_dict()
    keep = task_keys(cfg.task.name)
    if keep is not None:
        d["task"] = {k: v for k, v in d["task"].items() if k in keep}
    return d


def config_digest(cfg: TrainConfig | dict) -> dict[str, Any]:
    """The part of the config a checkpoint must match to be resumed: everything but the logging/output keys
    (:data:`RESUMABLE_KEYS`) and the ``task`` keys its task does not read. ``cfg`` may be a digest already (a
    checkpoint's), which is then reduced the same way."""
    d = json.loads(json.dumps(cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg), default=str))
    d.setdefault("eval", dataclasses.asdict(EvalConfig()))  # checkpoints of runs made before the section existed
    for section, key in RESUMABLE_KEYS:
        d.get(section, {}).pop(key, None)
    task = d.get("task", {})
    keep = task_keys(task.get("name"))
    if keep is not None:
        d["task"] = {k: v for k, v in task.items() if k in keep}
    return d


def task_keys(name: str | None) -> tuple[str, ...] | None:
    """The ``task`` keys task ``name`` reads (``config.yaml`` records only these; the others keep their defaults):
    what its recipe class declares (:attr:`diffattn.train.tasks.Task.options`); None for no task."""
    return task_options(name) if isinstance(name, str) else None


def __getattr__(name: str):
    if name == "TASK_KEYS":  # the table each recipe class now declares for itself
        return {t: task_keys(t) for t in TASKS}
    if name == "TASK_CLASSES":
        warnings.warn("diffattn.train.tasks.TASK_CLASSES is deprecated; use tuple(diffattn.train.tasks.TASKS)",
                      DeprecationWarning, stacklevel=2)
        return tuple(TASKS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
