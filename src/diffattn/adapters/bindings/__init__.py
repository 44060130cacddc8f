"""The bindings :func:`diffattn.retrofit` consults, in order: one per model library.

Each module imports only :mod:`diffattn.adapters.binding` (the protocol) and :mod:`diffattn.adapters.methods`; the
libraries themselves (transformers, timm, open_clip, ultralytics) are imported only when a model of theirs is
converted. To support another library, write a :class:`~diffattn.adapters.binding.Binding` and add it to
:data:`BINDINGS`.
"""

from __future__ import annotations

from ..binding import Binding
from .diffattn import DiffattnBinding
from .open_clip import OpenClipBinding
from .timm import TimmBinding
from .transformers import TransformersBinding
from .ultralytics import UltralyticsBinding

__all__ = ["BINDINGS", "DiffattnBinding", "OpenClipBinding", "TimmBinding", "TransformersBinding", "UltralyticsBinding"]

#: every binding, in the order retrofit asks them
BINDINGS: tuple[Binding, ...] = (TransformersBinding(), TimmBinding(), OpenClipBinding(), UltralyticsBinding(),
                                 DiffattnBinding())
