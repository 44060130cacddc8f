"""Differential attention without zero-padding for inference (prefill, evaluation) through PyTorch's FlexAttention:
:func:`flex_diff_attention`, defined in :mod:`diffattn.ops.unpadded` and re-exported here."""

from __future__ import annotations

from .ops.unpadded import flex_diff_attention

__all__ = ["flex_diff_attention"]
