"""Fused GPU kernels for :func:`diffattn.functional.diff_attention` (``backend="triton"``).

:func:`triton_diff_attention` is a one-pass Triton kernel for O = (w1 ⊙ A1 − λ ⊙ A2) V with its backward
(Ye et al. 2024, "Differential Transformer"); :func:`triton_unsupported_reason` says why it
cannot run given inputs. Importing this package needs ``triton`` but no GPU.
"""

from .triton_diff import triton_diff_attention, triton_unsupported_reason

__all__ = ["triton_diff_attention", "triton_unsupported_reason"]
