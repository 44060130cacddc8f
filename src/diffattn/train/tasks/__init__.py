"""Training recipes, one class per task, listed once in :data:`TASKS`; :func:`build_task` picks one from a config.
Each class declares the ``task`` keys it reads (:attr:`Task.options`)."""

from __future__ import annotations

import importlib
import warnings

from ..config import TrainConfig
from .base import Task, mean_lambdas

__all__ = ["Task", "build_task", "mean_lambdas", "TASKS", "task_class", "task_options"]

#: the recipes: ``task.name`` → (module of this package, class); imported on first use
TASKS: dict[str, tuple[str, str]] = {
    "clip": ("clip", "ClipTask"),
    "classify": ("classify", "ClassifyTask"),
    "lm": ("lm", "LMTask"),
    "retrofit": ("retrofit", "RetrofitTask"),
    "vlm": ("vlm", "VLMTask"),
    "paligemma": ("vlm", "PaliGemmaTask"),
}


def task_class(name: str) -> type[Task]:
    """The recipe class of task ``name`` (ValueError naming the valid ones)."""
    if name not in TASKS:
        raise ValueError(f"task.name must be one of {sorted(TASKS)}, got {name!r}")
    module, cls = TASKS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def task_options(name: str) -> tuple[str, ...] | None:
    """The ``task`` keys task ``name`` reads (its class's ``options``); None for a name that is no task."""
    return task_class(name).options if name in TASKS else None


def build_task(cfg: TrainConfig) -> Task:
    """The recipe named by ``cfg.task.name``."""
    return task_class(cfg.task.name)(cfg)


def __getattr__(name: str):
    if name == "TASK_CLASSES":
        warnings.warn("diffattn.train.tasks.TASK_CLASSES is deprecated; use tuple(diffattn.train.tasks.TASKS)",
                      DeprecationWarning, stacklevel=2)
        return tuple(TASKS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
