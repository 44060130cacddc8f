"""The attention operator: differential and standard attention on tensors already projected and split into heads,
and its backends.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A_b = softmax(cap(Q_b K_bᵀ · s) + M)          (Ye et al. 2024, eq. 1)

The package's modules:

- :mod:`~diffattn.ops.functional`: :func:`diff_attention`, :func:`diff_attention_pairs` (the branches' heads
  interleaved in one tensor, as the layers project them), :func:`attention`, :func:`decode_diff_attention`, the
  masks, and ``backend="auto"``'s rule (:func:`choose_backend`); ``diffattn.functional`` re-exports its public names;
- :mod:`~diffattn.ops.blockwise`: the ``sdpa`` backend's CPU training path (query blocks, A1 and A2 combined before
  one product by V, its own backward);
- :mod:`~diffattn.ops.kernels`: the fused one-pass Triton kernel (``backend="triton"``; importing it needs triton);
- :mod:`~diffattn.ops.dispatch`: ``auto``'s measured table of where the fused kernel beats ``sdpa`` per GPU
  (``dispatch.json``);
- :mod:`~diffattn.ops.masks`: what a mask entry means, read by the operator and the kernel;
- :mod:`~diffattn.ops.unpadded`: inference without zero-padding through FlexAttention (opt-in).

The names of :mod:`~diffattn.ops.functional`'s ``__all__``, re-exported here, are what the rest of the library (layers,
λ forms, retrofits, diagnostics) imports from here.
"""

from .functional import *  # noqa: F403 (the names of its __all__, listed there once)
from .functional import __all__ as __all__
