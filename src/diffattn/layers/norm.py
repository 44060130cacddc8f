"""Normalisation layers."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["RMSNorm", "head_rms_norm"]


class RMSNorm(nn.RMSNorm):
    """RMSNorm(x) = x / sqrt(mean(x²) + eps) ⊙ w over the last ``len(normalized_shape)`` dims (Zhang & Sennrich
    2019): PyTorch's ``nn.RMSNorm`` (same arguments, state dict and fused kernel), written out in elementary ops
    while ``torch.onnx.export`` traces it, because the TorchScript-based ONNX exporter (the one Ultralytics' and
    most deployment tools' ONNX export uses) has no ``aten::rms_norm`` at any opset."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.onnx.is_in_onnx_export():
            if self.weight is not None and self.weight.dtype != x.dtype:
                # under autocast x is bf16/fp16 and the weight fp32: PyTorch's fused kernel takes one dtype and
                # otherwise falls back to several elementwise kernels in eager mode (statistics stay fp32 in both)
                return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)
            return super().forward(x)
        dims = tuple(range(-len(self.normalized_shape), 0))
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y


def head_rms_norm(width: int, *, eps: float = 1e-5, affine: bool = True) -> RMSNorm:
    """Per-head RMSNorm of width 2d, the "GroupNorm" of Ye et al. 2024 §2.1 (``diff_norm``, eps 1e-5)."""
    return RMSNorm(width, eps=eps, elementwise_affine=affine)
