"""The optional extras of ``pip install 'diffattn[...]'`` and what each command needs from them.

A command whose extra is missing stops before it writes anything, with one line that names the package and the
extra (``diffattn train needs tensorboard: pip install 'diffattn[train]'``) instead of a ``ModuleNotFoundError``
halfway through. pyproject.toml's ``[project.optional-dependencies]`` is the source of the lists below; a test
checks they agree. Only the standard library and :mod:`diffattn.errors` (a leaf) are imported here.
"""

from __future__ import annotations

import importlib.util

from .errors import UsageError

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require"]

#: extra → (import name, distribution) of each package in it that diffattn's code imports
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (("yaml", "pyyaml"), ("tensorboard", "tensorboard"), ("sklearn", "scikit-learn"), ("PIL", "pillow"),
              ("tiktoken", "tiktoken"), ("webdataset", "webdataset")),
    "eval": (("yaml", "pyyaml"), ("sklearn", "scikit-learn"), ("matplotlib", "matplotlib"),
             ("imagecorruptions", "imagecorruptions-imaug")),
    "data": (("PIL", "pillow"), ("sklearn", "scikit-learn"), ("tiktoken", "tiktoken"), ("webdataset", "webdataset")),
}


class MissingExtraError(ImportError, UsageError):
    """An optional package a command needs is not installed; the message names it and the extra that brings it.
    An ``ImportError`` for library callers, and a :class:`~diffattn.errors.UsageError` for the ``diffattn`` command
    (one line, exit status 2)."""


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` whose modules cannot be imported here (checked without importing them)."""
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {sorted(EXTRAS)}, got {extra!r}")
    out = []
    for module, dist in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` (``"{what} needs tensorboard: pip install 'diffattn[train]'"``) when a
    package of ``extra`` is missing."""
    absent = missing(extra)
    if absent:
        raise MissingExtraError(f"{what} needs {', '.join(absent)}: pip install 'diffattn[{extra}]'")
