"""Model registry: ``create_model(name, **overrides)`` and ``list_models()``, in the manner of timm.

A model is registered by decorating a builder function ``name(**overrides) -> nn.Module``; its docstring becomes the
model's description. Model classes that can be saved register themselves through :class:`DiffattnModel`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

import torch.nn as nn

__all__ = ["register_model", "register_builder", "create_model", "list_models", "is_model", "model_builder"]

_BUILDERS: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register ``fn`` under its own name; raises if the name is taken."""
    name = fn.__name__
    if name in _BUILDERS and _BUILDERS[name] is not fn:
        raise ValueError(f"a model named {name!r} is already registered")
    _BUILDERS[name] = fn
    return fn


def register_builder(name: str, build: Callable[[dict], nn.Module], doc: str, module: str
                     ) -> Callable[..., nn.Module]:
    """Register ``name(**overrides) = build(overrides)``, for model families generated from config tables.

    ``module`` is the defining module's ``__name__`` (so the builder reads as that module's function).
    """

    def builder(**overrides) -> nn.Module:
        return build(overrides)

    builder.__name__ = builder.__qualname__ = name
    builder.__module__ = module
    builder.__doc__ = doc
    return register_model(builder)


def is_model(name: str) -> bool:
    _ensure_loaded()
    return name in _BUILDERS


def model_builder(name: str) -> Callable[..., nn.Module]:
    _ensure_loaded()
    if name not in _BUILDERS:
        close = fnmatch.filter(_BUILDERS, f"*{name.split('_')[0]}*")[:10]
        raise ValueError(f"unknown model {name!r}; see diffattn.models.list_models()"
                         + (f" (similar: {close})" if close else ""))
    return _BUILDERS[name]


def create_model(name: str, **overrides) -> nn.Module:
    """Build the registered model ``name``; keyword ``overrides`` replace entries of its config."""
    model = model_builder(name)(**overrides)
    model.model_name = name
    return model


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching the shell-style ``pattern``."""
    _ensure_loaded()
    return sorted(fnmatch.filter(_BUILDERS, pattern))


def _ensure_loaded() -> None:
    from . import _load_all  # noqa: F401  (importing the model modules registers them)
