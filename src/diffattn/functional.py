"""The attention operator's public module, as ``torch.nn.functional`` is PyTorch's: :func:`diff_attention`,
:func:`diff_attention_pairs`, :func:`attention`, :func:`decode_diff_attention`, the masks and ``backend="auto"``'s
rule (:func:`choose_backend`). They are defined in :mod:`diffattn.ops.functional` (the package :mod:`diffattn.ops`
holds the operator, its backends and kernels); this module re-exports them: ``diffattn.functional.diff_attention``
is ``diffattn.ops.diff_attention``.
"""

from .ops.functional import *  # noqa: F403 (the names of its __all__, listed there once)
from .ops.functional import __all__ as __all__
