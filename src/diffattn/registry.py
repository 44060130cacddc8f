"""Registries of classes by name: the one way the λ forms (:func:`diffattn.lambdas.register_lambda`) and the retrofit
methods (:func:`diffattn.adapters.register_method`) register a subclass under a name and look it up."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["registering", "registered"]


def registering(registry: dict[str, type], name: str, base: type, decorator: str,
                what: str) -> Callable[[type], type]:
    """The class decorator that adds a subclass of ``base`` to ``registry`` as ``name`` (once) and sets its ``name``;
    ``decorator`` (the function that made it) and ``what`` (what it registers) name them in the errors."""

    def register(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{decorator}({name!r}) needs a {base.__name__} subclass, got {cls!r}")
        if name in registry:
            raise ValueError(f"{what} {name!r} is already registered (by {registry[name].__name__})")
        cls.name = name
        registry[name] = cls
        return cls

    return register


def registered(registry: dict[str, type], name: str, key: str) -> type:
    """The class ``registry`` holds as ``name``; a ValueError naming the setting ``key`` and the registered names."""
    if name not in registry:
        raise ValueError(f"{key} must be one of {tuple(registry)}, got {name!r}")
    return registry[name]
