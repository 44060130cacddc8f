"""Training recipes: ``clip``, ``classify``, ``lm``, ``retrofit``, ``vlm``, ``paligemma``; :func:`build_task` picks
one from a config."""

from __future__ import annotations

from ..config import TrainConfig
from .base import Task, mean_lambdas

__all__ = ["Task", "build_task", "mean_lambdas", "TASK_CLASSES"]


def _classes() -> dict[str, type[Task]]:
    from .classify import ClassifyTask
    from .clip import ClipTask
    from .lm import LMTask
    from .retrofit import RetrofitTask
    from .vlm import PaliGemmaTask, VLMTask

    return {c.name: c for c in (ClipTask, ClassifyTask, LMTask, RetrofitTask, VLMTask, PaliGemmaTask)}


TASK_CLASSES = ("clip", "classify", "lm", "retrofit", "vlm", "paligemma")


def build_task(cfg: TrainConfig) -> Task:
    """The recipe named by ``cfg.task.name``."""
    classes = _classes()
    if cfg.task.name not in classes:
        raise ValueError(f"task.name must be one of {sorted(classes)}, got {cfg.task.name!r}")
    return classes[cfg.task.name](cfg)
