"""Checks of one setting's value, shared by every config that validates its settings: the attention kinds' ``Config``
(:mod:`diffattn.layers.spec`), the models' constructor arguments (:mod:`diffattn.models.config`) and the training
config (:mod:`diffattn.train.config`). A leaf: it imports nothing from diffattn.

Each check raises ``ValueError(f"{name} must be {what it needs}, got {value!r}")``, where ``name`` is the setting as
the message names it, with its owner: ``"attention sub_norm"``, ``"ViT: drop_rate"``.

    check_positive_int("attention sliding_window", 0)   # ValueError: attention sliding_window must be None or an
                                                        # integer >= 1, got 0
"""

from __future__ import annotations

import math
import numbers

__all__ = ["is_int", "check_flag", "check_positive_int", "check_positive_float", "check_probability"]


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer and not a bool (``True`` is an ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_flag(name: str, value: object) -> None:
    """ValueError unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def check_positive_int(name: str, value: object, *, optional: bool = True) -> None:
    """ValueError unless ``value`` is an integer >= 1 (or None where ``optional``)."""
    if value is None and optional:
        return
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be {'None or ' if optional else ''}an integer >= 1, got {value!r}")


def check_positive_float(name: str, value: object, *, optional: bool = False) -> None:
    """ValueError unless ``value`` is a finite real number > 0 (or None where ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0 < value < math.inf):
        raise ValueError(f"{name} must be {'None or ' if optional else ''}a finite float > 0, got {value!r}")


def check_probability(name: str, value: object) -> None:
    """ValueError unless ``value`` is a float in [0, 1) (a dropout probability)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
