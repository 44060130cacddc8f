"""Run a function once another library has been imported, without importing it.

``import diffattn`` must not import transformers or timm (seconds of import time, and their own side effects), yet
what diffattn adds to them must be there once the user has them: its vision models in timm's registry
(``timm.create_model("diff_vit_nano")``) and the :class:`~diffattn.adapters.RetrofitCheckpointWarning` filter on
transformers' loading logger. :func:`when_imported` runs the function at once if the library is already imported,
otherwise right after its ``import`` finishes, through one finder on ``sys.meta_path`` that wraps the library's
loader for that one import and then removes itself (what ``wrapt``'s post-import hooks do).

A hook that fails warns (:class:`DiffattnHookWarning`) instead of breaking the user's ``import``.
This module imports nothing but the standard library: it is what ``import diffattn`` runs.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType

__all__ = ["DiffattnHookWarning", "when_imported", "pending"]


class DiffattnHookWarning(RuntimeWarning):
    """What diffattn adds to a library (its timm models, its transformers log filter) could not be added."""


def _run(name: str, hook: Callable[[ModuleType], object], module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as e:  # the user's import of the library must not fail because of diffattn
        warnings.warn(f"diffattn could not hook into {name} ({hook.__qualname__}): {type(e).__name__}: {e}",
                      DiffattnHookWarning, stacklevel=2)


class _Loader:  # duck-typed, as importlib.abc would cost this import 20 ms
    """The library's own loader, then the hooks. The module sees its real loader (``__loader__``,
    ``__spec__.loader``) while it runs, so ``importlib.resources`` and friends work as without diffattn."""

    def __init__(self, loader, finder: _PostImportFinder, name: str):
        self._loader, self._finder, self._name = loader, finder, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._finder.fire(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _PostImportFinder:
    """Finds nothing itself: for a watched name, asks the finders after it and wraps the loader they return."""

    def __init__(self):
        self.hooks: dict[str, list[Callable[[ModuleType], object]]] = {}
        self._lock = threading.RLock()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.hooks:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):  # namespace package, legacy loader
            return spec
        spec.loader = _Loader(spec.loader, self, fullname)
        return spec

    def fire(self, name: str, module: ModuleType) -> None:
        with self._lock:
            hooks = self.hooks.pop(name, [])
            if not self.hooks and self in sys.meta_path:
                sys.meta_path.remove(self)
        for hook in hooks:
            _run(name, hook, module)


_finder = _PostImportFinder()


def when_imported(name: str, hook: Callable[[ModuleType], object]) -> None:
    """Call ``hook(module)`` once the module ``name`` is imported: now if it is in ``sys.modules``, else right
    after its import (by anyone) finishes. ``hook`` runs at most once; an exception in it becomes a
    :class:`DiffattnHookWarning`."""
    module = sys.modules.get(name)
    if module is not None:
        _run(name, hook, module)
        return
    with _finder._lock:
        _finder.hooks.setdefault(name, []).append(hook)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def pending() -> list[str]:
    """The modules whose hooks have not run yet (they are not imported)."""
    with _finder._lock:
        return sorted(_finder.hooks)
