"""Normalisation layers."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["RMSNorm", "head_rms_norm", "scaled_rms_norm"]


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


class _ScaledRMSNormFn(torch.autograd.Function):
    """y = x · rstd · w, rstd = (‖x‖²/D + eps)^(−½), with the backward written out (CPU, float32/float64):

        x̂ = x · rstd,   ∂L/∂x = rstd · (g⊙w − x̂ · ⟨g⊙w, x̂⟩ / D),   ∂L/∂w = Σ_rows g ⊙ x̂

    PyTorch's CPU ``rms_norm`` is a composite of six ops forward and about twelve backward; this is five and
    seven (on CUDA ``F.rms_norm`` is one fused kernel each way and is used instead)."""

    @staticmethod
    def forward(ctx, x, w, eps: float):
        D = x.shape[-1]
        rstd = torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True)  # (..., 1)
        rstd = rstd.mul_(rstd).div_(D).add_(eps).rsqrt_()
        xh = x * rstd
        ctx.save_for_backward(xh, rstd, w)
        return xh * w if w is not None else xh.clone()

    @staticmethod
    def backward(ctx, g):
        xh, rstd, w = ctx.saved_tensors
        D = xh.shape[-1]
        gw = g * w if w is not None else g
        dot = (gw * xh).sum(-1, keepdim=True)  # (..., 1)
        dx = torch.addcmul(gw, xh, dot, value=-1.0 / D).mul_(rstd)
        dw = None
        if w is not None and ctx.needs_input_grad[1]:
            dw = (g * xh).sum(dim=tuple(range(g.dim() - 1)))  # (D,), no copy of a permuted g
        return dx, dw, None


def scaled_rms_norm(x: torch.Tensor, norm: nn.Module, scale: float = 1.0) -> torch.Tensor:
    """``norm(x) * scale`` for an :class:`RMSNorm` (or ``nn.Identity``) ``norm``, in the fewest ops: the scale is
    folded into the norm's weight (a vector of width D instead of the whole output), and the norm runs as one fused
    op where PyTorch has one (CUDA) or through :class:`_ScaledRMSNormFn` when training on the CPU. The sub-norm ×
    (1 − λ_init) of differential attention (Ye et al. 2024, §2.1) is this with ``scale = 1 − λ_init``."""
    if not isinstance(norm, RMSNorm) or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing():
        out = norm(x)
        return out * scale if scale != 1.0 else out
    w = norm.weight
    if w is not None:
        w = w.to(x.dtype) if w.dtype != x.dtype else w
        w = w * scale if scale != 1.0 else w
    elif scale != 1.0:
        w = torch.full(x.shape[-1:], scale, dtype=x.dtype, device=x.device)
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and torch.is_grad_enabled()
            and (x.requires_grad or (w is not None and w.requires_grad)) and not torch.compiler.is_compiling()):
        return _ScaledRMSNormFn.apply(x, w, float(eps))
    return F.rms_norm(x, norm.normalized_shape, w, eps)
