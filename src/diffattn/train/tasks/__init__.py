"""Training tasks, one module per task in this folder, each a :class:`Task` subclass registered with
:func:`register_task` into :data:`TASKS` (the one table of tasks). This package imports every module of its folder
(so a new task is one new file) and looks tasks up by name; nothing else switches on a task's name.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ...deprecations import moved_attribute
from .base import TASKS, Task, TaskConfig, mean_lambdas, register_task

__all__ = ["Task", "TaskConfig", "TASKS", "register_task", "build_task", "mean_lambdas", "task_class",
           "task_options", "task_keys"]

for _info in pkgutil.iter_modules(__path__):  # every task module registers its task on import
    importlib.import_module(f"{__name__}.{_info.name}")


def task_class(name: str) -> type[Task]:
    """The task registered as ``name`` (ValueError naming the registered ones)."""
    if name not in TASKS:
        raise ValueError(f"task.name must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name]


def task_options(name: str) -> tuple[str, ...] | None:
    """The ``task`` keys task ``name`` reads (the fields of its ``Config``); None for a name that is no task."""
    return TASKS[name].options if name in TASKS else None


def build_task(cfg: Any) -> Task:
    """The task named by ``cfg.task.name``, for the run of ``cfg``."""
    return task_class(cfg.task.name)(cfg)


def task_keys(name: str | None) -> tuple[str, ...] | None:
    """The ``task`` keys task ``name`` reads (``config.yaml`` records only these); None for no task."""
    return task_options(name) if isinstance(name, str) else None


_deprecated = moved_attribute(__name__, {"TASK_CLASSES": lambda: tuple(TASKS)})


def __getattr__(name: str):
    if name == "TASK_KEYS":  # the table each task's Config now declares for itself
        return {t: task_keys(t) for t in TASKS}
    return _deprecated(name)  # the deprecated names (diffattn.deprecations), else AttributeError
