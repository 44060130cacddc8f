"""The contract between :func:`diffattn.retrofit` and a model library: the :class:`Binding` protocol.

A binding knows one library's attention modules. It finds them (:meth:`Binding.find`), reads their sizes
(:meth:`Binding.dims`) and swaps each for a module that runs :func:`diffattn.adapters.methods.run_method`
(:meth:`Binding.convert`). Bindings import this module and :mod:`~diffattn.adapters.methods` only; the list of
bindings :func:`~diffattn.adapters.retrofit` consults is ``diffattn.adapters.bindings.BINDINGS``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch.nn as nn

from .methods import RetrofitAdapter

__all__ = ["ADAPTER_ATTR", "Binding", "BindingBase", "Candidate", "parent_of", "candidates", "optional_class",
           "retrofitted_class"]

#: attribute of a converted attention module that holds its :class:`RetrofitAdapter`
ADAPTER_ATTR = "diff_adapter"


@dataclass(frozen=True)
class Candidate:
    """An attention module a binding can convert: ``parent.<attr>`` is ``module``, ``name`` its qualified name."""

    name: str
    module: nn.Module
    parent: nn.Module
    attr: str
    binding: Binding


@runtime_checkable
class Binding(Protocol):
    """What a model library's binding provides."""

    #: human-readable families it converts (shown in errors and by :func:`diffattn.adapters.supported_families`)
    families: tuple[str, ...]

    def find(self, model: nn.Module) -> list[Candidate]:
        """Every attention module of ``model`` this binding can convert, in module order."""
        ...

    def dims(self, module: nn.Module) -> tuple[int, ...]:
        """(D, h, d): the width of the layer input, the query head count and the head width; a binding whose
        value heads are wider than its query/key heads returns (D, h, d, dv)."""
        ...

    def extra_trainable(self, candidate: Candidate) -> list[nn.Module]:
        """Modules outside ``candidate.module`` that belong to the attention (BERT's output projection lives in
        the parent): trainable with ``train="attention"``."""
        ...

    def convert(self, candidate: Candidate, adapter: RetrofitAdapter) -> nn.Module:
        """Retrofit ``candidate.module`` in place (or replace it in its parent); returns the module now in place,
        which holds ``adapter`` as its attribute :data:`ADAPTER_ATTR`."""
        ...


def parent_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """(parent module, attribute) of the submodule called ``name`` in ``model``."""
    if "." not in name:
        return model, name
    owner, attr = name.rsplit(".", 1)
    return model.get_submodule(owner), attr


def candidates(model: nn.Module, binding: Binding, match: Callable[[nn.Module], bool]) -> list[Candidate]:
    """Every submodule of ``model`` that ``match`` accepts, in module order, as a :class:`Candidate` of
    ``binding`` (what a binding's ``find`` returns)."""
    return [Candidate(name, m, *parent_of(model, name), binding) for name, m in model.named_modules() if match(m)]


def optional_class(load: Callable[[], type]) -> Callable[[], type | None]:
    """Decorator: ``load`` (a function that imports a model library's class and returns it) called once, its class
    kept; None when the library is not installed. A binding imports its library only when a model is searched."""

    @functools.cache
    def cached() -> type | None:
        try:
            return load()
        except ImportError:
            return None

    return functools.update_wrapper(cached, load)


@functools.cache
def retrofitted_class(base: type | None, name: str, what: str, module: str, *, missing: str = "",
                      **methods: Callable) -> type:
    """The subclass ``name`` of ``base`` (the library's attention class, called ``what`` in its docstring) that a
    converted module becomes, defined in the binding's ``module`` (so that pickles find it) with ``methods``
    (``forward``, …) running the retrofit; made once per base. ``base`` None (the library is not installed): an
    ImportError saying ``missing``."""
    if base is None:
        raise ImportError(missing)
    doc = f"{what} retrofitted with differential attention (never built directly: see retrofit)."
    return type(name, (base,), {**methods, "__module__": module, "__doc__": doc})


class BindingBase:
    """What most bindings share: no modules outside the attention train with it, and :meth:`convert` swaps the
    module's class in place for :meth:`retrofitted_class` (parameters and state-dict names stay)."""

    def extra_trainable(self, c: Candidate) -> list[nn.Module]:
        return []

    def retrofitted_class(self, module: nn.Module) -> type:
        """The class a converted ``module`` becomes (a subclass of its own)."""
        raise NotImplementedError

    def convert(self, c: Candidate, adapter: RetrofitAdapter) -> nn.Module:
        m = c.module
        m.__class__ = self.retrofitted_class(m)
        setattr(m, ADAPTER_ATTR, adapter)
        return m
